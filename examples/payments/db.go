package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Payment is one row of <prefix>payments, and the JSON of POST /payments and
// GET /payments/{id}.
type Payment struct {
	// ID is the payment's UUID.
	ID string `json:"id"`
	// Status is "succeeded": the provider charged the amount.
	Status string `json:"status"`
	// AmountCents is the amount in the currency's minor unit, 1 to maxAmount.
	AmountCents int64 `json:"amountCents"`
	// Currency is an ISO 4217 code, three upper-case letters.
	Currency string `json:"currency"`
	// CustomerID is the caller's customer reference.
	CustomerID string `json:"customerId"`
	// ProviderChargeID is the provider's charge id; unique among payments.
	ProviderChargeID string `json:"providerChargeId"`
	// State is where the provider's webhooks have taken the payment:
	// "authorized" when created, then "captured" (charge.succeeded), then
	// "refunded" (charge.refunded). POST /payments answers "authorized", and
	// its replays too: they are the first answer.
	State string `json:"state"`
}

// payments is the payments table and its transitions' log.
type payments struct {
	pool        *pgxpool.Pool
	table       string // quoted
	transitions string // quoted
}

func newPayments(pool *pgxpool.Pool, prefix string) *payments {
	return &payments{pool: pool, table: pgx.Identifier{prefix + "payments"}.Sanitize(),
		transitions: pgx.Identifier{prefix + "payment_transitions"}.Sanitize()}
}

// migrate creates the table if it does not exist, under a transaction-scoped
// advisory lock so replicas starting together do not race on the catalog.
// provider_charge_id is unique: the natural key that keeps one row per charge
// even if an idempotency record is gone (expired) when a retry arrives.
func (p *payments) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idemkey examples/payments ' || $1))`, p.table); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	id                 uuid PRIMARY KEY,
	principal          text NOT NULL,
	idempotency_key    text NOT NULL,
	customer_id        text NOT NULL,
	amount_cents       bigint NOT NULL CHECK (amount_cents > 0),
	currency           text NOT NULL,
	status             text NOT NULL,
	provider_charge_id text NOT NULL UNIQUE,
	created_at         timestamptz NOT NULL DEFAULT now()
)`, p.table))
		if err != nil {
			return err
		}
		// state follows the provider's webhooks (webhook.go); every transition
		// that happened is logged once in the transitions table.
		if err := p.addStateColumn(ctx, tx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	payment_id uuid NOT NULL,
	event_id   text NOT NULL,
	from_state text NOT NULL,
	to_state   text NOT NULL,
	at         timestamptz NOT NULL DEFAULT now()
)`, p.transitions))
		return err
	})
}

// addStateColumn adds the state column to a payments table that predates it.
// The catalog is asked first because ALTER TABLE ... ADD COLUMN IF NOT EXISTS
// takes an ACCESS EXCLUSIVE lock even when the column exists: every start of
// a server would queue behind the transactions using the table, and every
// payment behind it.
func (p *payments) addStateColumn(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'state' AND NOT attisdropped)`,
		p.table).Scan(&exists); err != nil || exists {
		return err
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN state text NOT NULL DEFAULT 'authorized'`, p.table))
	return err
}

// insert adds the payment of a charge in tx. If a row for the same provider
// charge exists already (the natural-key safety net), it returns that row
// instead, and created is false.
func (p *payments) insert(ctx context.Context, tx pgx.Tx, principal, key string, pay Payment) (_ Payment, created bool, err error) {
	pay.ID = uuid.NewString()
	tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s
	(id, principal, idempotency_key, customer_id, amount_cents, currency, status, provider_charge_id, state)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
	ON CONFLICT (provider_charge_id) DO NOTHING`, p.table),
		pay.ID, principal, key, pay.CustomerID, pay.AmountCents, pay.Currency, pay.Status, pay.ProviderChargeID, pay.State)
	if err != nil {
		return Payment{}, false, err
	}
	if tag.RowsAffected() == 1 {
		return pay, true, nil
	}
	existing, owner, err := p.scan(tx.QueryRow(ctx, fmt.Sprintf(`SELECT `+columns+`, principal FROM %s WHERE provider_charge_id = $1`, p.table), pay.ProviderChargeID))
	if err != nil {
		return Payment{}, false, err
	}
	if owner != principal {
		return Payment{}, false, fmt.Errorf("charge %s is recorded for another principal", pay.ProviderChargeID)
	}
	return existing, false, nil
}

// errNoPayment: no payment with that id for that principal.
var errNoPayment = errors.New("no such payment")

// get returns the principal's payment id, or errNoPayment. id is any form
// uuid.Parse reads (urn:uuid:..., braces, no hyphens); the query gets its
// canonical form, so no spelling of a client's reaches Postgres's parser.
func (p *payments) get(ctx context.Context, principal, id string) (Payment, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Payment{}, errNoPayment
	}
	pay, _, err := p.scan(p.pool.QueryRow(ctx, fmt.Sprintf(`SELECT `+columns+`, principal FROM %s WHERE id = $1 AND principal = $2`, p.table), u.String(), principal))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, errNoPayment
	}
	return pay, err
}

// count returns the number of rows (tests).
func (p *payments) count(ctx context.Context) (int, error) {
	var n int
	err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+p.table).Scan(&n)
	return n, err
}

const columns = `id::text, status, amount_cents, currency, customer_id, provider_charge_id, state`

func (p *payments) scan(row pgx.Row) (Payment, string, error) {
	var pay Payment
	var principal string
	err := row.Scan(&pay.ID, &pay.Status, &pay.AmountCents, &pay.Currency, &pay.CustomerID, &pay.ProviderChargeID, &pay.State, &principal)
	return pay, principal, err
}

// dbTimeout bounds one transaction's statements, so a hung database answers 503
// instead of holding the claim.
const dbTimeout = 5 * time.Second
