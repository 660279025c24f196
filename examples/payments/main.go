// Command payments is the drop-in payment endpoint: a handler that charges
// through a payment provider and records the payment in its own Postgres, behind
// the idempotency middleware, safe to retry end to end.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' go run ./examples/payments
//
// Routes:
//
//	POST /payments       {"amountCents": n, "currency": "EUR", "customerId": "..."}
//	                     Idempotency-Key required; 201 {"id", "status", "amountCents",
//	                     "currency", "customerId", "providerChargeId", "state"}
//	GET  /payments/{id}  200, the same JSON (the state now); 404 for another
//	                     principal's payment
//	POST /webhooks       the provider's signed events (charge.succeeded,
//	                     charge.refunded), each transition once (webhook.go)
//	GET  /               a checkout page (no external assets)
//	GET  /healthz        liveness
//
// Both /payments routes need "Authorization: Bearer <token>" with a token of
// PAYMENTS_TOKENS (401 problem details otherwise, before the middleware). The
// token's principal is the scope of the idempotency keys: keys belong to who
// sent them, so two merchants' "order-1" never meet and none can replay
// another's payment.
//
// Three layers make a payment happen once (docs/architecture.md section 9):
// the idempotency record completes in the same transaction as the payment row
// (store/postgres CommitResponse); the provider gets a key derived from the
// idempotency key and deduplicates on it; the payment row is unique on the
// provider's charge id.
//
// Environment:
//
//	ADDR                   listen address, default 127.0.0.1:8080
//	DATABASE_URL           Postgres, required (exit 2 without it)
//	GATEWAY_URL            the payment provider's base URL (a query string is kept on
//	                       every call, e.g. http://127.0.0.1:9090/?lose=0.2); default:
//	                       the fake gateway (package fakegateway) in-process
//	IDEM_LEASE             claim lease, Go duration, at least 100ms, default 10s
//	IDEM_RETENTION         how long answers are replayed, default 24h
//	PAYMENTS_TOKENS        token=principal,..., default demo=merchant-demo
//	PAYMENTS_TABLE_PREFIX  prefix of the tables <prefix>payments, <prefix>idemkey_records,
//	                       <prefix>payment_transitions, <prefix>webhook_inbox and
//	                       <prefix>outbox, default none
//	PAYMENTS_FAULTS        1: honour the X-Fault request header (tests only): crash-after-commit,
//	                       crash-before-commit, slow=<duration>
//	PAYMENTS_WEBHOOK_SECRET     the provider's webhook signing secret; without it
//	                            POST /webhooks answers 404
//	PAYMENTS_WEBHOOK_TOLERANCE  the largest age (or clock skew) of a webhook's
//	                            signature timestamp, Go duration, default 5m
//
// Tables are created at startup. Once the listener accepts connections the
// server prints "listening on http://ADDR"; on SIGINT or SIGTERM it lets
// in-flight requests finish.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/inbox"
	"github.com/idemkey/idemkey/store/postgres/outbox"
	"github.com/idemkey/idemkey/store/sweep"
)

func main() {
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	serve.Main("payments", func(ctx context.Context, _ func(string) string, stdout io.Writer, logger *slog.Logger) error {
		return run(ctx, cfg, stdout, logger)
	})
}

// maxGatewayTimeout bounds a call to the provider; with a short lease the bound
// is half the lease, leaving the other half to record the payment.
const maxGatewayTimeout = 5 * time.Second

// run serves until ctx is done, then drains in-flight requests.
func run(ctx context.Context, cfg config, stdout io.Writer, logger *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return fmt.Errorf("%w: DATABASE_URL: %w", errConfig, err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	records, err := postgres.New(pool, postgres.WithTable(cfg.tablePrefix+"idemkey_records"), postgres.WithLogger(logger))
	if err != nil {
		return err
	}
	if err := records.Migrate(ctx); err != nil {
		return fmt.Errorf("idempotency records: %w", err)
	}
	stopSweeper := records.StartSweeper(context.WithoutCancel(ctx), time.Minute)
	defer stopSweeper()
	pays := newPayments(pool, cfg.tablePrefix)
	if err := pays.migrate(ctx); err != nil {
		return fmt.Errorf("payments table: %w", err)
	}
	ob, hooks, err := openOutboxInbox(ctx, pool, cfg.tablePrefix)
	if err != nil {
		return err
	}
	// Event ids past the inbox's retention (7 days, longer than the provider
	// redelivers) are removed every hour.
	defer sweep.Start(ctx, time.Hour, func(ctx context.Context) (int64, error) { return hooks.Sweep(ctx, 0) },
		logger, "webhook inbox")()

	gatewayURL := cfg.gatewayURL
	if gatewayURL == "" {
		stop, url, err := startFakeGateway(logger)
		if err != nil {
			return err
		}
		defer stop()
		gatewayURL = url
	}
	gw, err := newGatewayClient(gatewayURL, min(maxGatewayTimeout, cfg.lease/2))
	if err != nil {
		return err
	}

	h, err := newHandler(cfg, &api{pool: pool, records: records, payments: pays, gateway: gw, logger: logger,
		outbox: ob, webhooks: hooks, webhookSecret: []byte(cfg.webhookSecret), webhookTolerance: cfg.webhookTolerance}, logger)
	if err != nil {
		return err
	}
	return serve.ListenAndServe(ctx, cfg.addr, h, stdout, logger,
		"gateway", gatewayURL, "tables", cfg.tablePrefix+"payments, "+records.Table(), "faults", cfg.faults, "webhooks", cfg.webhookSecret != "")
}

// newHandler routes the page and the probes outside the middleware, and the
// payments behind authentication (and, with faults on, the X-Fault reader) and
// the middleware.
func newHandler(cfg config, a *api, logger *slog.Logger) (http.Handler, error) {
	m, err := middleware.New(a.records, scope,
		middleware.WithLease(cfg.lease), middleware.WithRecordRetention(policy.RetentionRule{Default: cfg.retention}), middleware.WithLogger(logger))
	if err != nil {
		return nil, err
	}
	create := m.Handler(http.HandlerFunc(a.createPayment))
	if cfg.faults {
		create = withFaults(create)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(cfg.tokens, create))
	mux.Handle("GET /payments/{id}", authenticate(cfg.tokens, http.HandlerFunc(a.getPayment)))
	mux.HandleFunc("POST /webhooks", a.receiveWebhook) // the provider's signature, not a token, authenticates it
	mux.HandleFunc("GET /{$}", servePage)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusNotFound, codeNotFound, "No such route: POST /payments, GET /payments/{id}, POST /webhooks, GET /.", 0)
	})
	return mux, nil
}

// startFakeGateway serves a fakegateway without faults on a free loopback port.
func startFakeGateway(logger *slog.Logger) (stop func(), url string, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("in-process gateway: %w", err)
	}
	srv := &http.Server{Handler: fakegateway.New(fakegateway.Faults{}, logger.With("component", "gateway")), ReadHeaderTimeout: serve.ReadHeaderTimeout}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			logger.Error("in-process gateway stopped", "err", err)
		}
	}()
	return func() { _ = srv.Close() }, "http://" + ln.Addr().String(), nil
}

// openOutboxInbox migrates the outbox of receipts (<prefix>outbox) and the
// inbox of webhook event ids (<prefix>webhook_inbox).
func openOutboxInbox(ctx context.Context, pool *pgxpool.Pool, prefix string) (*outbox.Outbox, *inbox.Inbox, error) {
	ob, err := outbox.New(pool, outbox.WithTable(prefix+"outbox"))
	if err != nil {
		return nil, nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, nil, fmt.Errorf("outbox: %w", err)
	}
	in, err := inbox.New(pool, inbox.WithTable(prefix+"webhook_inbox"))
	if err != nil {
		return nil, nil, err
	}
	if err := in.Migrate(ctx); err != nil {
		return nil, nil, fmt.Errorf("webhook inbox: %w", err)
	}
	return ob, in, nil
}
