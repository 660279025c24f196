// Command consumer applies payment instructions from a message broker to Postgres
// exactly once, through the Postgres inbox (package store/postgres/inbox,
// docs/architecture.md sections 10 and 11): each instruction's row and its
// inbox row commit in one transaction, and the message is acked only after the
// commit. A redelivery (a lost ack, a crash between commit and ack, a producer
// that published twice) finds the instruction in the inbox and is acked without
// a change; a failed handler rolls back and the message is redelivered.
//
//	CONSUMER_BROKER=nats go run ./examples/consumer       # JetStream: stream PAYMENTS on payments.>
//	CONSUMER_BROKER=rabbitmq go run ./examples/consumer   # durable queue payments.instructions
//
// It prints "consuming <broker>" once subscribed. A broker that goes away (a
// restart, a network cut) is waited for: the consumer reconnects (RabbitMQ with
// back-off from 200 ms doubling to 10 s, NATS every second) and consumes again,
// logging the outage once when it begins and once when it ends; the messages it
// held unacked are redelivered, and the inbox answers those already applied. Only
// a broker that cannot be reached at startup is an error.
//
// Messages: NATS subject payments.instructions, or the RabbitMQ queue
// payments.instructions on the default exchange; body
// {"instructionId": "...", "accountId": "...", "amountCents": n}; header
// Idempotency-Key: <instructionId>, the message id of the inbox. The broker's own
// message id (Nats-Msg-Id, AMQP message-id) is not used: it differs on every
// publish of the same instruction. A body is checked as the account API checks
// its requests: those three members exactly so spelled (letter case included),
// each once and no other, amountCents an integer from 1 to 2147483647. A message
// that fails the check is poison: it is logged and rejected for good (JetStream
// Term, AMQP reject without requeue: dead-lettered where the queue has a
// dead-letter exchange, else dropped), and the queue moves on.
//
// Environment:
//
//	CONSUMER_BROKER        nats (default) or rabbitmq
//	NATS_URL               default nats://127.0.0.1:4222
//	AMQP_URL               default amqp://guest:guest@127.0.0.1:5672/
//	DATABASE_URL           required: Postgres for the instructions and the inbox
//	CONSUMER_TABLE_PREFIX  prefix of the tables <prefix>applied_instructions and <prefix>consumer_inbox (default none)
//	CONSUMER_WORKERS       messages applied concurrently (default 8)
//	CONSUMER_NATS_STREAM   stream name (default PAYMENTS)
//	CONSUMER_NATS_SUBJECT_PREFIX  prefix of the stream's subjects <prefix>payments.> and of the
//	                       consumed <prefix>payments.instructions (default none)
//	CONSUMER_NATS_DURABLE  durable pull consumer (default payments-applier)
//	CONSUMER_ACK_WAIT      JetStream's redelivery delay of an unacked message (default 30s)
//	CONSUMER_AMQP_QUEUE    queue name (default payments.instructions)
//
// Fault injection for tests and demos:
//
//	CONSUMER_FAULT_FAIL_FIRST_PERCENT  the handler fails the first delivery of this
//	                       percentage of instructions (chosen by a hash of the id), 0-100
//	CONSUMER_FAULT_STALL_AFTER_COMMITS after this many commits every worker stops right
//	                       before its ack, until the process is killed
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/store/postgres/inbox"
)

func main() { serve.Main("consumer", run) }

// config is the command's environment, parsed.
type config struct {
	broker      string
	natsURL     string
	amqpURL     string
	databaseURL string
	tablePrefix string
	workers     int

	stream        string
	subjectPrefix string
	durable       string
	ackWait       time.Duration
	queue         string

	failFirstPercent  int
	stallAfterCommits int64

	// withoutInbox applies instructions without the inbox (duplicates twice):
	// the baseline of the benchmarks, never set from the environment.
	withoutInbox bool
}

func loadConfig(getenv func(string) string) (config, error) {
	or := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	c := config{
		broker:        or("CONSUMER_BROKER", "nats"),
		natsURL:       or("NATS_URL", "nats://127.0.0.1:4222"),
		amqpURL:       or("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		databaseURL:   getenv("DATABASE_URL"),
		tablePrefix:   getenv("CONSUMER_TABLE_PREFIX"),
		stream:        or("CONSUMER_NATS_STREAM", "PAYMENTS"),
		subjectPrefix: getenv("CONSUMER_NATS_SUBJECT_PREFIX"),
		durable:       or("CONSUMER_NATS_DURABLE", "payments-applier"),
		queue:         or("CONSUMER_AMQP_QUEUE", "payments.instructions"),
	}
	if c.broker != "nats" && c.broker != "rabbitmq" {
		return c, fmt.Errorf("CONSUMER_BROKER=%q: want nats or rabbitmq", c.broker)
	}
	if c.databaseURL == "" {
		return c, errors.New("DATABASE_URL is required (Postgres for the instructions and the inbox)")
	}
	var err error
	if c.workers, err = intEnv(getenv, "CONSUMER_WORKERS", 8, 1, 1024); err != nil {
		return c, err
	}
	if c.failFirstPercent, err = intEnv(getenv, "CONSUMER_FAULT_FAIL_FIRST_PERCENT", 0, 0, 100); err != nil {
		return c, err
	}
	stall, err := intEnv(getenv, "CONSUMER_FAULT_STALL_AFTER_COMMITS", 0, 0, 1<<30)
	if err != nil {
		return c, err
	}
	c.stallAfterCommits = int64(stall)
	c.ackWait = 30 * time.Second
	if v := getenv("CONSUMER_ACK_WAIT"); v != "" {
		if c.ackWait, err = time.ParseDuration(v); err != nil || c.ackWait < time.Second {
			return c, fmt.Errorf("CONSUMER_ACK_WAIT=%q: want a Go duration of at least 1s", v)
		}
	}
	return c, nil
}

func intEnv(getenv func(string) string, name string, def, lo, hi int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer in %d-%d", name, v, lo, hi)
	}
	return n, nil
}

// run is the command's body (serve.RunFunc): it consumes until ctx is done.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	return consume(ctx, cfg, stdout, logger)
}

// consume sets up the tables and the broker, prints "consuming <broker>" and
// applies messages until ctx is done; in-flight messages finish (commit and
// ack) before it returns.
func consume(ctx context.Context, cfg config, stdout io.Writer, logger *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	if !strings.Contains(cfg.databaseURL, "pool_max_conns") {
		pcfg.MaxConns = int32(cfg.workers + 1) // one per worker, one for the sweeper
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	a, err := newApplier(ctx, pool, cfg, logger)
	if err != nil {
		return err
	}
	var src source
	switch cfg.broker {
	case "nats":
		src, err = openNATS(ctx, cfg, logger)
	default:
		src, err = openRabbitMQ(ctx, cfg, logger)
	}
	if err != nil {
		return err
	}
	defer src.Close()
	if _, err := fmt.Fprintf(stdout, "consuming %s\n", cfg.broker); err != nil {
		logger.Warn("cannot print the ready line", "err", err)
	}
	logger.Info("consuming", "broker", cfg.broker, "workers", cfg.workers, "table", a.table)
	if a.inbox != nil {
		go sweep(ctx, a.inbox, logger)
	}
	return a.run(ctx, src)
}

// sweep removes inbox rows past their retention every hour until ctx is done.
func sweep(ctx context.Context, in *inbox.Inbox, logger *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := in.Sweep(ctx, 0); err != nil && ctx.Err() == nil {
			logger.Warn("inbox sweep failed; retrying in an hour", "deleted", n, "err", err)
		}
	}
}
