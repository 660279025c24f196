package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/store/postgres/inbox"
)

const (
	// consumerName is this handler's name in the inbox: another handler of the
	// same messages records them under its own name.
	consumerName = "payments-applier"
	// applyTimeout bounds one message's transaction.
	applyTimeout = 30 * time.Second
	// maxIDLen bounds instructionId and accountId, in bytes.
	maxIDLen = 200
	// maxLoggedBody bounds the part of a malformed body that is logged, in bytes.
	maxLoggedBody = 512
	// maxPrefixLen keeps <prefix>applied_instructions within Postgres's 63-byte names.
	maxPrefixLen = 40
)

// delivery is one message as a broker hands it over.
type delivery interface {
	Body() []byte
	// Key is the Idempotency-Key header, "" when absent.
	Key() string
	// First reports whether this is the message's first delivery.
	First() bool
	// Ack settles the message after its transaction committed (or it was a duplicate).
	Ack() error
	// Nack asks the broker to deliver the message again.
	Nack() error
	// Reject drops a malformed message for good (dead-lettered where the broker is so configured).
	Reject() error
}

// source is a subscription. Deliveries is closed once Stop took effect.
type source interface {
	Deliveries() <-chan delivery
	// Stop stops fetching; messages fetched but not acked are redelivered later.
	Stop()
	// Close ends the connection, after Stop and once no worker uses a delivery.
	Close() error
}

// instruction is the body of a message.
type instruction struct {
	InstructionID string `json:"instructionId"`
	AccountID     string `json:"accountId"`
	AmountCents   *int64 `json:"amountCents"`
}

var errMalformed = errors.New("malformed instruction")

// decode parses and checks a message as the account API checks a request body
// (package httpapi): exactly one JSON object whose members are instructionId,
// accountId and amountCents, spelled exactly so (letter case included), each
// once, no other; amountCents an integer from 1 to httpapi.MaxAmountCents. The
// Idempotency-Key header must name the body's instructionId; when the header is
// absent the body's id is used. Every refusal wraps errMalformed.
func decode(body []byte, key string) (instruction, error) {
	var in instruction
	name, err := httpapi.DecodeObject(json.NewDecoder(bytes.NewReader(body)), []httpapi.Field{
		{Name: "instructionId", Dst: &in.InstructionID}, {Name: "accountId", Dst: &in.AccountID}, {Name: "amountCents", Dst: &in.AmountCents}})
	if err != nil {
		if name != "" {
			return in, fmt.Errorf("%w: member %q: %v", errMalformed, name, err)
		}
		return in, fmt.Errorf("%w: body is not the instruction JSON object: %v", errMalformed, err)
	}
	switch {
	case in.InstructionID == "" || in.AccountID == "" || in.AmountCents == nil:
		return in, fmt.Errorf("%w: instructionId, accountId and amountCents are required", errMalformed)
	case *in.AmountCents < 1 || *in.AmountCents > httpapi.MaxAmountCents:
		return in, fmt.Errorf("%w: amountCents %d, want 1 to %d", errMalformed, *in.AmountCents, httpapi.MaxAmountCents)
	case len(in.InstructionID) > maxIDLen || len(in.AccountID) > maxIDLen:
		return in, fmt.Errorf("%w: instructionId and accountId are at most %d bytes", errMalformed, maxIDLen)
	case strings.IndexByte(in.InstructionID, 0) >= 0 || strings.IndexByte(in.AccountID, 0) >= 0:
		return in, fmt.Errorf("%w: NUL in an id", errMalformed)
	case key != "" && key != in.InstructionID:
		return in, fmt.Errorf("%w: Idempotency-Key %q differs from instructionId %q", errMalformed, key, in.InstructionID)
	}
	return in, nil
}

// applier applies instructions through the inbox.
type applier struct {
	pool      *pgxpool.Pool
	inbox     *inbox.Inbox // nil with cfg.withoutInbox
	cfg       config
	logger    *slog.Logger
	table     string // quoted
	insertSQL string
	commits   atomic.Int64
}

var errInjected = errors.New("injected handler failure (CONSUMER_FAULT_FAIL_FIRST_PERCENT)")

// newApplier creates the instructions table and migrates the inbox.
func newApplier(ctx context.Context, pool *pgxpool.Pool, cfg config, logger *slog.Logger) (*applier, error) {
	if len(cfg.tablePrefix) > maxPrefixLen || strings.IndexByte(cfg.tablePrefix, 0) >= 0 {
		return nil, fmt.Errorf("CONSUMER_TABLE_PREFIX=%q: at most %d bytes, no NUL", cfg.tablePrefix, maxPrefixLen)
	}
	a := &applier{pool: pool, cfg: cfg, logger: logger,
		table: pgx.Identifier{cfg.tablePrefix + "applied_instructions"}.Sanitize()}
	a.insertSQL = `INSERT INTO ` + a.table + ` (instruction_id, account_id, amount_cents) VALUES ($1, $2, $3)`
	// Two consumers starting at once must not race on CREATE TABLE.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "idemkey-consumer:"+a.table); err != nil {
			return err
		}
		// No unique constraint: only the inbox keeps one row per instruction.
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+a.table+` (
    instruction_id text        NOT NULL,
    account_id     text        NOT NULL,
    amount_cents   bigint      NOT NULL,
    applied_at     timestamptz NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", a.table, err)
	}
	if !cfg.withoutInbox {
		if a.inbox, err = inbox.New(pool, inbox.WithTable(cfg.tablePrefix+"consumer_inbox")); err != nil {
			return nil, err
		}
		if err := a.inbox.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// run applies deliveries with cfg.workers workers until ctx is done. Then it
// stops the subscription and applies what the broker had already handed over
// (RabbitMQ's prefetch; JetStream's pulled batch is left to redelivery), so a
// graceful stop leaves nothing unacked that it holds.
func (a *applier) run(ctx context.Context, src source) error {
	stopped := make(chan struct{})
	go func() {
		<-ctx.Done()
		src.Stop()
		close(stopped)
	}()
	var wg sync.WaitGroup
	for range a.cfg.workers {
		wg.Go(func() {
			for d := range src.Deliveries() {
				a.handle(ctx, d)
			}
		})
	}
	wg.Wait()
	if ctx.Err() == nil {
		return errors.New("the broker ended the subscription (its queue, stream or consumer deleted?)")
	}
	<-stopped
	a.logger.Info("stopped consuming", "commits", a.commits.Load())
	return nil
}

// handle applies one delivery and settles it: ack after the commit (or for a
// duplicate), nack after a failure, reject when malformed.
func (a *applier) handle(ctx context.Context, d delivery) {
	in, err := decode(d.Body(), d.Key())
	if err != nil {
		body := d.Body()
		if len(body) > maxLoggedBody {
			body = body[:maxLoggedBody]
		}
		a.logger.Error("rejecting a malformed message", "err", err, "body", string(body), "body_bytes", len(d.Body()))
		a.settle("reject", d.Reject())
		return
	}
	// The transaction finishes even when a shutdown begins meanwhile.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
	defer cancel()
	outcome, err := a.apply(tctx, in, d.First())
	if err != nil {
		level := slog.LevelWarn
		if errors.Is(err, errInjected) {
			level = slog.LevelInfo
		}
		a.logger.Log(ctx, level, "instruction not applied; nacked for redelivery",
			"instruction", in.InstructionID, "err", err)
		a.settle("nack", d.Nack())
		return
	}
	if outcome == inbox.Applied {
		if n := a.commits.Add(1); a.cfg.stallAfterCommits > 0 && n >= a.cfg.stallAfterCommits {
			// Committed, never acked: the crash window the inbox closes.
			<-ctx.Done()
			return
		}
	}
	a.settle("ack", d.Ack())
}

// settle logs a failed ack, nack or reject: the broker redelivers the message,
// and the inbox answers the redelivery.
func (a *applier) settle(what string, err error) {
	if err != nil {
		a.logger.Warn("cannot "+what+" a message; the broker will redeliver it", "err", err)
	}
}

// apply records the instruction in the inbox and inserts its row, in one
// transaction.
func (a *applier) apply(ctx context.Context, in instruction, first bool) (inbox.Outcome, error) {
	write := func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, a.insertSQL, in.InstructionID, in.AccountID, *in.AmountCents); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if first && a.failFirst(in.InstructionID) {
			return errInjected // after the write: the rollback must undo it
		}
		return nil
	}
	if a.inbox == nil {
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error { return write(ctx, tx) })
		return inbox.Applied, err
	}
	return a.inbox.Process(ctx, consumerName, in.InstructionID, write)
}

// failFirst picks CONSUMER_FAULT_FAIL_FIRST_PERCENT of the instructions by a
// hash of their id, the same in every process.
func (a *applier) failFirst(id string) bool {
	if a.cfg.failFirstPercent == 0 {
		return false
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32()%100) < a.cfg.failFirstPercent
}
