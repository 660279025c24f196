package accountsapp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// memoryWire is the smallest server: the memory store, the middleware, the API.
func memoryWire(ctx context.Context, env setup.Env, conns *setup.Conns, logger *slog.Logger) (*App, http.Handler, error) {
	st := memory.New()
	idem, err := middleware.New(st, middleware.ScopeFromPrincipal(AnonymousScope), middleware.WithLogger(logger))
	if err != nil {
		return nil, nil, err
	}
	app, err := Open(ctx, env, conns, st, prometheus.NewRegistry(), logger)
	if err != nil {
		return nil, nil, err
	}
	return app, ClientID(idem.Handler(app.API)), nil
}

// TestRunRefusesBadEnvironment: a bad environment is an error before listening.
func TestRunRefusesBadEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want error
	}{
		{map[string]string{"IDEM_LEASE": "soon"}, setup.ErrConfig},
		{map[string]string{"IDEM_STORE": "postgres"}, setup.ErrConfig}, // no DATABASE_URL
		{map[string]string{"IDEM_STORE": "etcd"}, setup.ErrConfig},
		{map[string]string{"IDEM_STORE": "redis", "REDIS_URL": "not a url"}, setup.ErrConfig},
	} {
		var out strings.Builder
		err := Run(context.Background(), func(k string) string { return tc.env[k] }, &out, slog.New(slog.DiscardHandler), memoryWire)
		if !errors.Is(err, tc.want) || out.Len() != 0 {
			t.Errorf("%v: %v (printed %q), want %v", tc.env, err, out.String(), tc.want)
		}
	}
}

// TestRun: the listening line carries the resolved address; cancelling the
// context shuts down cleanly.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	env := map[string]string{"ADDR": "127.0.0.1:0"}
	go func() {
		done <- Run(ctx, func(k string) string { return env[k] }, pw, slog.New(slog.DiscardHandler), memoryWire)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil {
		t.Fatal(err)
	}
	url := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.HasSuffix(url, ":0") {
		t.Fatalf("listening line %q", line)
	}
	resp, err := http.Get(url + "/api/accounts")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/accounts: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after shutdown", err)
	}
}
