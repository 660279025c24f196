package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// DefaultWaiterIdle is how long the waiters' listening connection stays open
// after the last waiter left (WithWaiterIdle).
const DefaultWaiterIdle = 30 * time.Second

// ErrNoListener is returned (wrapped) by Wait when the store's Querier cannot lend
// a connection for LISTEN: only a *pgxpool.Pool can. It wraps
// errors.ErrUnsupported, so the middleware polls instead.
var ErrNoListener = fmt.Errorf("idemkey/store/postgres: wait needs a *pgxpool.Pool to listen on: %w", errors.ErrUnsupported)

// WithWaiterIdle sets how long the connection Wait listens on stays open after
// the last waiter returned (default DefaultWaiterIdle; 0 or less: closed at
// once), so a steady trickle of waiting duplicates does not open a connection
// each.
func WithWaiterIdle(d time.Duration) Option { return func(s *Store) { s.waiters.Idle = d } }

// acquirer is the part of *pgxpool.Pool the listener uses.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// The waiters' statements; %[1]s is the quoted table name.
const (
	// waitSQL flags a claim in flight as waited for. It matches no row when the
	// key holds no live claim (absent, completed, lease expired), and it re-checks
	// the newest row version, so a Complete or Release that commits first is seen.
	waitSQL = `UPDATE %[1]s SET waiters = true
WHERE scope = $1 AND key = $2 AND status IS NULL AND lease_until > now() AND expires_at > now()`

	// notifyReturning ends completeSQL and releaseSQL: a flagged row notifies the
	// store's channel (%[2]s, a literal) with the hash of its ID, sent when the
	// statement's transaction commits.
	notifyReturning = `
RETURNING CASE WHEN waiters THEN pg_notify('%[2]s', encode(sha256(int4send(length(scope)) || scope || key), 'hex')) END`
)

// waitPayload is the notification payload of id, as notifyReturning computes it:
// the hex SHA-256 of the scope's length (4 bytes, big-endian), the scope and the
// key.
func waitPayload(id store.ID) string {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(id.Scope)))
	h.Write(n[:])
	h.Write([]byte(id.Scope))
	h.Write([]byte(id.Key))
	return hex.EncodeToString(h.Sum(nil))
}

// channelName is the store's notification channel: one per table.
func channelName(qualified string) string {
	sum := sha256.Sum256([]byte(qualified))
	return "idemkey_" + hex.EncodeToString(sum[:8])
}

// Wait implements store.Waiter with LISTEN/NOTIFY: one listening connection per
// store (taken out of the pool while anyone waits and WithWaiterIdle after,
// then closed; StopWaiters closes it at once),
// whatever the number of waiters; the notification of a key wakes all its
// waiters in this process. It registers, makes sure the connection listens, then
// flags the row as waited for in one statement (the check): no live claim
// returns nil at once. Complete, CompleteTx and Release of a flagged row notify
// when they commit; a key nobody waits for never notifies. Losing the listening
// connection wakes the waiters (a spurious nil: they claim again). Errors:
// store.ErrInvalid for an invalid ID (ID.Validate), ErrNoListener when the Querier is
// not a pool, ctx.Err(), the driver's errors wrapped. With WithPolledWait (or
// WithTransactionPooler), Wait polls the key's row instead and needs no pool.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if s.polling {
		return s.pollWait(ctx, id)
	}
	if _, ok := s.db.(acquirer); !ok {
		return fmt.Errorf("idemkey/store/postgres: wait: %w", ErrNoListener)
	}
	return s.waiters.Wait(ctx, waitPayload(id), func(ctx context.Context) (bool, error) {
		tag, err := s.exec(ctx, s.waitSQL, bytesOf(id.Scope), bytesOf(id.Key))
		if err != nil {
			return false, fmt.Errorf("idemkey/store/postgres: wait: %w", err)
		}
		return tag.RowsAffected() > 0, nil
	})
}

// listen is the waiters' connection (waitset.Listen): it takes a connection out
// of the pool for good (Hijack, so closing the pool never waits for it), listens
// on the store's channel and hands each notification to the waiters until ctx
// ends or the connection fails; then it closes the connection.
func (s *Store) listen(ctx context.Context, set *waitset.Set, ready func(error)) error {
	pc, err := s.db.(acquirer).Acquire(ctx)
	if err != nil {
		err = fmt.Errorf("idemkey/store/postgres: wait: listen: %w", err)
		ready(err)
		return err
	}
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		err = fmt.Errorf("idemkey/store/postgres: wait: listen: %w", err)
		ready(err)
		return err
	}
	ready(nil)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("idemkey/store/postgres: wait: listen: %w", err)
		}
		if n.Channel == s.channel {
			set.Notify(n.Payload)
		}
	}
}

// StopWaiters closes the waiters' listening connection now, if open, and waits
// for its goroutine to end; waiters still waiting are woken (they claim again)
// and a later Wait opens it again. Call it when shutting down, after the last
// request.
func (s *Store) StopWaiters() { s.waiters.Stop() }
