// Command relay publishes the payments example's outbox (store/postgres/outbox,
// table <PAYMENTS_TABLE_PREFIX>outbox) to NATS JetStream: every receipt the
// payments server committed with its payment, at least once, with the message
// id as Nats-Msg-Id (JetStream drops a re-publish within the stream's
// duplicate window) and as Idempotency-Key; the receipts consumer's inbox makes
// it once. Several relays may run at once (FOR UPDATE SKIP LOCKED).
//
//	DATABASE_URL=... go run ./examples/payments/relay
//
// It prints "relaying to nats" once connected, and stops on SIGINT or SIGTERM
// after the batch in progress.
//
// Environment:
//
//	DATABASE_URL                    Postgres, required (the payments server's)
//	PAYMENTS_TABLE_PREFIX           the payments server's table prefix, default none
//	NATS_URL                        default nats://127.0.0.1:4222
//	PAYMENTS_NATS_STREAM            default PAYMENTS, on <prefix>payments.>, created if missing
//	PAYMENTS_NATS_SUBJECT_PREFIX    prefixes the subject payments.receipts, default none
//	PAYMENTS_NATS_DUPLICATE_WINDOW  the stream's Nats-Msg-Id window if created here, default 2m
//	RELAY_BATCH                     messages per batch (one transaction), default 100
//	RELAY_FAULT_STALL_AFTER         tests: after this many publishes every publish blocks,
//	                                its batch uncommitted, until the process is killed
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/payments/internal/natsenv"
	"github.com/idemkey/idemkey/store/postgres/outbox"
)

func main() { serve.Main("relay", run) }

func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	nc, err := natsenv.FromEnv(getenv)
	if err != nil {
		return err
	}
	if getenv("DATABASE_URL") == "" {
		return errors.New("DATABASE_URL is required: the outbox is in the payments server's Postgres")
	}
	batch, err := intEnv(getenv, "RELAY_BATCH", outbox.DefaultBatchSize)
	if err != nil {
		return err
	}
	stallAfter, err := intEnv(getenv, "RELAY_FAULT_STALL_AFTER", 0)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	ob, err := outbox.New(pool, outbox.WithTable(getenv("PAYMENTS_TABLE_PREFIX")+"outbox"), outbox.WithBatchSize(batch), outbox.WithLogger(logger))
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	conn, js, err := natsenv.Open(ctx, nc, "idemkey-payments-relay", logger)
	if err != nil {
		return err
	}
	defer conn.Close()
	publish := publisher(js, nc, int64(stallAfter), logger)
	fmt.Fprintln(stdout, "relaying to nats")
	logger.Info("relaying", "outbox", ob.Table(), "stream", nc.Stream, "batch", batch)
	if err := ob.Relay(ctx, publish); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// publisher returns the outbox's publish func: a JetStream publish that
// returns once the stream has stored the message (its PubAck).
func publisher(js jetstream.JetStream, nc natsenv.Config, stallAfter int64, logger *slog.Logger) outbox.PublishFunc {
	var published atomic.Int64
	return func(ctx context.Context, m outbox.Message) error {
		if stallAfter > 0 && published.Load() >= stallAfter {
			logger.Warn("RELAY_FAULT_STALL_AFTER: stalling before a publish, the batch uncommitted", "published", published.Load())
			<-ctx.Done()
			return ctx.Err()
		}
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: nc.Subject(m.Topic), Data: m.Payload,
			Header: nats.Header{jetstream.MsgIDHeader: {m.ID}, "Idempotency-Key": {m.ID}}})
		if err != nil {
			return err
		}
		published.Add(1)
		if ack.Duplicate {
			logger.Debug("JetStream dropped a re-publish within its duplicate window", "id", m.ID)
		}
		return nil
	}
}

func intEnv(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || (n == 0 && def > 0) {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}
