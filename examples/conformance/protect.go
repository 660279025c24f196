package main

import (
	"log/slog"
	"net/http"

	"github.com/idemkey/idemkey/examples/internal/storeenv"
	"github.com/idemkey/idemkey/middleware"
)

// protect puts the fixture's routes behind the idempotency middleware: POST and
// PATCH require a key, GET passes through.
func protect(cfg config, st *storeenv.Store, f *fixture, logger *slog.Logger) (http.Handler, error) {
	opts := []middleware.Option{
		middleware.WithLease(cfg.lease),
		middleware.WithRetention(cfg.retention),
		middleware.WithKeyRequired(true),
		middleware.WithLogger(logger),
	}
	if cfg.replayHeader != "" {
		opts = append(opts, middleware.WithReplayedHeader(cfg.replayHeader))
	}
	m, err := middleware.New(st, f.scope, opts...)
	if err != nil {
		return nil, err
	}
	return m.Handler(f.routes()), nil
}
