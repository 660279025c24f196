package accountsapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Server timeouts. Writes wait for the account service's write loop (at most three
// attempts with backoff, each bounded by the Celeriant client's request timeout).
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 60 * time.Second
	IdleTimeout       = 2 * time.Minute
	// ShutdownTimeout bounds the drain of in-flight requests after SIGINT/SIGTERM.
	ShutdownTimeout = 30 * time.Second
)

// Mount builds a server's root handler from the wired App: its router with
// a.Healthz, a.Readyz, a.MetricsHandler() and a.API behind a.Idempotency.
type Mount func(a *App) http.Handler

// Main is a server's main function: it runs Run with the process environment,
// stdout and a text slog logger on stderr until SIGINT or SIGTERM, and exits 1 on
// error. name labels the log lines.
func Main(name string, mount Mount) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", name)
	if err := Run(ctx, os.Getenv, os.Stdout, logger, mount); err != nil {
		logger.Error("server stopped", "err", err)
		os.Exit(1)
	}
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

// Serve serves mount(app) on app.Config.Addr and prints "listening on http://ADDR"
// (the resolved address, so ADDR=host:0 works) to stdout once the listener accepts
// connections. When ctx is done it stops accepting and lets in-flight requests
// finish (up to ShutdownTimeout); it does not close app. It returns nil after a
// clean shutdown.
func Serve(ctx context.Context, app *App, mount Mount, stdout io.Writer, logger *slog.Logger) error {
	cfg := app.Config
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR=%q: %w", cfg.Addr, err)
	}
	srv := &http.Server{
		Handler:           mount(app),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if _, err := fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr()); err != nil {
		logger.Warn("cannot print the listening line", "err", err)
	}
	logger.Info("serving", "addr", ln.Addr().String(), "store", app.Store.Name,
		"celeriant", celeriantName(cfg), "projection", cfg.Projection, "lease", cfg.Lease, "retention", cfg.Retention)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down: draining in-flight requests", "timeout", ShutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("graceful shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

func celeriantName(cfg Config) string {
	if cfg.CeleriantAddr == "" {
		return "in-process simulator"
	}
	return cfg.CeleriantAddr
}
