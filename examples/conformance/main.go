// Command conformance serves the fixture app of docs/conformance.md
// behind the idempotency middleware, so a peer's conformance vectors (the IETF
// draft-ietf-httpapi-idempotency-key-header) can drive it over HTTP.
//
//	go run ./examples/conformance
//
// Environment (docs/architecture.md section 6):
//
//	ADDR                listen address, default 127.0.0.1:8080
//	IDEM_STORE          memory (default), postgres, redis or tiered
//	DATABASE_URL        Postgres, for postgres and tiered
//	REDIS_URL           Redis, for redis and tiered
//	IDEM_LEASE          lease of a claim, Go duration, default 10s
//	IDEM_RETENTION      how long responses are replayed, default 24h
//	IDEM_REPLAY_HEADER  header marking a replay, default Idempotent-Replayed
//
// The scope of a key is the X-Client-ID header ("anonymous" when absent). Once the
// listener accepts connections the server prints "listening on http://ADDR"; it
// shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/internal/storeenv"
)

func main() { serve.Main("conformance", run) }

// config is the environment the fixture runs with.
type config struct {
	addr         string
	lease        time.Duration
	retention    time.Duration
	replayHeader string
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{addr: "127.0.0.1:8080", lease: 10 * time.Second, retention: 24 * time.Hour, replayHeader: getenv("IDEM_REPLAY_HEADER")}
	if v := getenv("ADDR"); v != "" {
		c.addr = v
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"IDEM_LEASE", &c.lease}, {"IDEM_RETENTION", &c.retention}} {
		v := getenv(d.name)
		if v == "" {
			continue
		}
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed <= 0 {
			return c, fmt.Errorf("%s=%q: want a positive Go duration such as 10s", d.name, v)
		}
		*d.dst = parsed
	}
	if c.retention < c.lease {
		return c, fmt.Errorf("IDEM_RETENTION (%v) must be at least IDEM_LEASE (%v)", c.retention, c.lease)
	}
	return c, nil
}

// run serves until ctx is done, then drains in-flight requests.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	st, err := storeenv.Open(ctx, getenv)
	if err != nil {
		return err
	}
	defer st.Close()

	handler, err := newHandler(cfg, st, logger)
	if err != nil {
		return err
	}
	return serve.ListenAndServe(ctx, cfg.addr, handler, stdout, logger, "store", st.Name)
}

// newHandler mounts the fixture: /reset and /healthz outside the middleware,
// everything else behind it.
func newHandler(cfg config, st *storeenv.Store, logger *slog.Logger) (http.Handler, error) {
	f := &fixture{}
	protected, err := protect(cfg, st, f, logger)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reset", f.reset)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.Handle("/", protected)
	return mux, nil
}
