package accountsapp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/internal/setup"
)

// Wire builds a server on the parsed environment and its connections: the
// idempotency store, metrics and middleware, the App, and the root handler that
// routes them. Each server's main.go has one. On error it closes what it opened
// (conns are closed by the caller).
type Wire func(ctx context.Context, env setup.Env, conns *setup.Conns, logger *slog.Logger) (*App, http.Handler, error)

// Main is a server's main function: Run with the process environment until
// SIGINT or SIGTERM (see serve.Main). name labels the log lines.
func Main(name string, wire Wire) {
	serve.Main(name, func(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
		return Run(ctx, getenv, stdout, logger, wire)
	})
}

// Run parses the environment (setup.Load), opens its connections
// (setup.Connect), wires the server, serves it with Serve until ctx is done, then
// closes the App and the connections. It returns nil after a clean shutdown.
func Run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger, wire Wire) error {
	env, err := setup.Load(getenv)
	if err != nil {
		return err
	}
	conns, err := setup.Connect(ctx, env)
	if err != nil {
		return err
	}
	defer conns.Close()
	app, h, err := wire(ctx, env, conns, logger)
	if err != nil {
		return err
	}
	defer app.Close()
	return Serve(ctx, app.Env, h, stdout, logger)
}

// Serve serves h on env.Addr with serve.ListenAndServe: it prints
// "listening on http://ADDR" once the listener accepts connections and, when ctx
// is done, lets in-flight requests finish. It closes nothing.
func Serve(ctx context.Context, env setup.Env, h http.Handler, stdout io.Writer, logger *slog.Logger) error {
	return serve.ListenAndServe(ctx, env.Addr, h, stdout, logger, "store", env.Store,
		"celeriant", celeriantName(env), "projection", env.Projection, "lease", env.Lease, "retention", env.Retention)
}

func celeriantName(env setup.Env) string {
	if len(env.CeleriantAddrs) == 0 {
		return "in-process simulator"
	}
	return strings.Join(env.CeleriantAddrs, ",")
}
