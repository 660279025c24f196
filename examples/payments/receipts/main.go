// Command receipts consumes the payments example's receipts from NATS
// JetStream (subject payments.receipts, published by the relay) and records
// each once in <PAYMENTS_TABLE_PREFIX>receipts, through the Postgres inbox
// (store/postgres/inbox, table <prefix>receipts_inbox) keyed on the message's
// Nats-Msg-Id, the outbox message id ("receipt:<payment id>"): a re-publish by
// a relay that died mid-batch, or a redelivery after a lost ack, is acked and
// changes nothing. The row stands for the e-mail a real service would send
// from it (a mailer reading the table sends each once).
//
//	DATABASE_URL=... go run ./examples/payments/receipts
//
// It prints "consuming nats" once subscribed, and stops on SIGINT or SIGTERM.
//
// Environment: DATABASE_URL (required), PAYMENTS_TABLE_PREFIX, NATS_URL,
// PAYMENTS_NATS_STREAM, PAYMENTS_NATS_SUBJECT_PREFIX and
// PAYMENTS_NATS_DUPLICATE_WINDOW as for the relay; RECEIPTS_DURABLE, the
// durable pull consumer, default payment-receipts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/payments/internal/natsenv"
	"github.com/idemkey/idemkey/store/postgres/inbox"
	"github.com/idemkey/idemkey/store/sweep"
)

// consumerName is the receipts handler's name in the inbox.
const consumerName = "payment-receipts"

func main() { serve.Main("receipts", run) }

func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	nc, err := natsenv.FromEnv(getenv)
	if err != nil {
		return err
	}
	if getenv("DATABASE_URL") == "" {
		return errors.New("DATABASE_URL is required: receipts and their inbox live in Postgres")
	}
	durable := getenv("RECEIPTS_DURABLE")
	if durable == "" {
		durable = "payment-receipts"
	}
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	prefix := getenv("PAYMENTS_TABLE_PREFIX")
	in, err := inbox.New(pool, inbox.WithTable(prefix+"receipts_inbox"))
	if err != nil {
		return err
	}
	if err := in.Migrate(ctx); err != nil {
		return err
	}
	// Without it the inbox would grow by one row per receipt forever.
	defer sweep.Start(ctx, time.Hour, func(ctx context.Context) (int64, error) { return in.Sweep(ctx, 0) },
		logger, "receipts inbox")()
	table := pgx.Identifier{prefix + "receipts"}.Sanitize()
	// No unique constraint of its own: the inbox alone keeps one row per receipt.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
	payment_id  text        NOT NULL,
	message_id  text        NOT NULL,
	body        jsonb       NOT NULL,
	received_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fmt.Errorf("receipts table: %w", err)
	}
	conn, js, err := natsenv.Open(ctx, nc, "idemkey-payments-receipts", logger)
	if err != nil {
		return err
	}
	defer conn.Close()
	cons, err := js.CreateOrUpdateConsumer(ctx, nc.Stream, jetstream.ConsumerConfig{Durable: durable,
		FilterSubject: nc.Subject("payments.receipts"), AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1})
	if err != nil {
		return fmt.Errorf("durable consumer %s: %w", durable, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { handle(ctx, in, table, m, logger) })
	if err != nil {
		return fmt.Errorf("consume %s: %w", durable, err)
	}
	fmt.Fprintln(stdout, "consuming nats")
	logger.Info("consuming receipts", "stream", nc.Stream, "durable", durable, "table", table)
	<-ctx.Done()
	cc.Drain()
	<-cc.Closed()
	return nil
}

// handle records one receipt through the inbox, then acks; on an error it
// nacks, and JetStream delivers the message again.
func handle(ctx context.Context, in *inbox.Inbox, table string, m jetstream.Msg, logger *slog.Logger) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	var r struct {
		PaymentID string `json:"paymentId"`
	}
	if err := json.Unmarshal(m.Data(), &r); err != nil || id == "" || r.PaymentID == "" {
		logger.Error("malformed receipt; dropped", "id", id, "err", err)
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	outcome, err := in.Process(ctx, consumerName, id, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (payment_id, message_id, body) VALUES ($1, $2, $3)`, r.PaymentID, id, m.Data())
		return err
	})
	if err != nil {
		logger.Warn("receipt not recorded; redelivering", "id", id, "err", err)
		_ = m.Nak()
		return
	}
	if outcome == inbox.AlreadyProcessed {
		logger.Info("duplicate receipt; acked, nothing recorded", "id", id)
	}
	_ = m.Ack()
}
