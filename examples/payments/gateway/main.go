// Command gateway is the fake payment provider of the payments example (package
// fakegateway): POST /charges deduplicated by Idempotency-Key, GET /charges
// listing every charge, POST /charges/{id}/refund, signed webhooks delivered at
// least once, and injectable faults.
//
//	go run ./examples/payments/gateway
//
// Environment:
//
//	ADDR                listen address, default 127.0.0.1:9090
//	GATEWAY_LATENCY     Go duration added before every charge answer, default 0
//	GATEWAY_FAIL_RATE   share (0 to 1) of charges answered 503 without charging
//	GATEWAY_LOSE_RATE   share (0 to 1) of charges whose answer is lost after charging
//	GATEWAY_LOSE_FIRST  1: the first answer for every new key is lost after charging
//	GATEWAY_WEBHOOK_URL         where events (charge.succeeded, charge.refunded) are
//	                            POSTed, signed; default: none are sent
//	GATEWAY_WEBHOOK_SECRET      the HMAC-SHA256 key of the signatures, required with the URL
//	GATEWAY_WEBHOOK_DELIVERIES  copies of each event, each delivered until answered 2xx, default 1
//	GATEWAY_WEBHOOK_SHUFFLE     1: deliver the waiting copies in random order
//
// The query parameters latency, fail, lose and loseFirst of POST /charges override
// the environment for that call. Once the listener accepts connections it prints
// "listening on http://ADDR"; it shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

// DefaultAddr is the listen address without ADDR.
const DefaultAddr = "127.0.0.1:9090"

func main() { serve.Main("gateway", run) }

func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	faults, err := fakegateway.FaultsFromEnv(getenv)
	if err != nil {
		return err
	}
	addr := strings.TrimSpace(getenv("ADDR"))
	if addr == "" {
		addr = DefaultAddr
	}
	hooks, err := fakegateway.WebhooksFromEnv(getenv)
	if err != nil {
		return err
	}
	g := fakegateway.New(faults, logger)
	if err := g.StartWebhooks(ctx, hooks); err != nil {
		return err
	}
	return serve.ListenAndServe(ctx, addr, g, stdout, logger,
		"latency", faults.Latency, "failRate", faults.FailRate, "loseRate", faults.LoseRate, "loseFirst", faults.LoseFirst,
		"webhookURL", hooks.URL, "webhookDeliveries", hooks.Deliveries, "webhookShuffle", hooks.Shuffle)
}
