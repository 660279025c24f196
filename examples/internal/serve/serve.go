// Package serve runs the examples' HTTP servers: the listening line the public
// contract promises (docs/architecture.md section 6), server timeouts, and a graceful
// shutdown on SIGINT or SIGTERM.
package serve

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

	goredis "github.com/redis/go-redis/v9"
)

// Server timeouts. Writes may wait for the account service's write loop (at most
// three attempts with backoff, each bounded by the Celeriant client's timeout).
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 60 * time.Second
	IdleTimeout       = 2 * time.Minute
	// ShutdownTimeout bounds the drain of in-flight requests after SIGINT/SIGTERM.
	ShutdownTimeout = 30 * time.Second
)

// RunFunc is a server's body: it serves until ctx is done.
type RunFunc func(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error

// Main runs run with the process environment, stdout and a text slog logger on
// stderr (go-redis's own lines at the debug level) until SIGINT or SIGTERM, and
// exits 1 on error. name labels the log lines.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", name)
	// go-redis logs every failed dial of its pool itself, so a Redis outage would
	// print a line per request; the tiered store logs the outage once instead, so
	// go-redis's lines (process-wide: its logger is a package variable) go to the
	// debug level.
	goredis.SetLogger(redisLogger{logger.With("component", "go-redis")})
	if err := run(ctx, os.Getenv, os.Stdout, logger); err != nil {
		logger.Error("server stopped", "err", err)
		os.Exit(1)
	}
}

// redisLogger hands go-redis's log lines to slog at the debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...))
}

// ListenAndServe serves h on addr and prints "listening on http://ADDR" to stdout
// once the listener accepts connections (the resolved address, so host:0 works).
// When ctx is done it stops accepting and lets in-flight requests finish, up to
// ShutdownTimeout. It returns nil after a clean shutdown. attrs are logged with
// the start line.
func ListenAndServe(ctx context.Context, addr string, h http.Handler, stdout io.Writer, logger *slog.Logger, attrs ...any) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ADDR=%q: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           h,
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
	logger.Info("serving", append([]any{"addr", ln.Addr().String()}, attrs...)...)

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
