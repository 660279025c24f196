package accountsapp

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	"github.com/idemkey/idemkey/examples/internal/serve"
)

// Mount builds a server's root handler from the wired App: its router with
// a.Healthz, a.Readyz, a.MetricsHandler() and a.API behind a.Idempotency.
type Mount func(a *App) http.Handler

// Main is a server's main function: Run with the process environment until
// SIGINT or SIGTERM (see serve.Main). name labels the log lines.
func Main(name string, mount Mount) {
	serve.Main(name, func(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
		return Run(ctx, getenv, stdout, logger, mount)
	})
}

// Run loads the Config from getenv, opens the App, serves it with Serve until ctx
// is done, then closes the App. It returns nil after a clean shutdown.
func Run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger, mount Mount) error {
	cfg, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	app, err := Open(ctx, cfg, getenv, logger)
	if err != nil {
		return err
	}
	defer app.Close()
	return Serve(ctx, app, mount, stdout, logger)
}

// Serve serves mount(app) on app.Config.Addr with serve.ListenAndServe: it
// prints "listening on http://ADDR" once the listener accepts connections and,
// when ctx is done, lets in-flight requests finish. It does not close app.
func Serve(ctx context.Context, app *App, mount Mount, stdout io.Writer, logger *slog.Logger) error {
	cfg := app.Config
	return serve.ListenAndServe(ctx, cfg.Addr, mount(app), stdout, logger, "store", app.Store.Name,
		"celeriant", celeriantName(cfg), "projection", cfg.Projection, "lease", cfg.Lease, "retention", cfg.Retention)
}

func celeriantName(cfg Config) string {
	if cfg.CeleriantAddr == "" {
		return "in-process simulator"
	}
	return cfg.CeleriantAddr
}
