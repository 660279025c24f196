package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// DefaultListenerIdle is how long the waiters' listening connection stays open
// after the last waiter left (WithListenerIdle).
const DefaultListenerIdle = 30 * time.Second

// ErrNoListener is returned (wrapped) by Wait when the store's Querier cannot lend
// a connection for LISTEN: only a *pgxpool.Pool can.
var ErrNoListener = errors.New("idemkey/postgres: wait needs a *pgxpool.Pool to listen on")

// WithListenerIdle sets how long the connection Wait listens on stays open after
// the last waiter returned (default DefaultListenerIdle; 0 or less: closed at
// once), so a steady trickle of waiting duplicates does not open a connection
// each.
func WithListenerIdle(d time.Duration) Option { return func(s *Store) { s.listenIdle = d } }

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

// listener fans the notifications of one LISTEN connection out to the waiters
// of this process, by key.
type listener struct {
	mu      sync.Mutex
	keys    map[string]*waitKey // by payload
	waiters int
	run     *listenRun // nil when not listening
	idle    *time.Timer
	wg      sync.WaitGroup // the listening goroutines
}

// waitKey is one waited-for key: ch is closed by its notification.
type waitKey struct {
	ch chan struct{}
	n  int
}

// listenRun is one listening connection's life.
type listenRun struct {
	ready  chan struct{} // closed once LISTEN is active or failed (err set)
	done   chan struct{} // closed when the connection is gone
	err    error
	cancel context.CancelFunc
}

// Wait implements store.Waiter with LISTEN/NOTIFY: one listening connection per
// store (taken from the pool while anyone waits, and WithListenerIdle after),
// whatever the number of waiters; the notification of a key wakes all its
// waiters in this process. It registers, makes sure the connection listens, then
// flags the row as waited for in one statement (the check): no live claim
// returns nil at once. Complete, CompleteTx and Release of a flagged row notify
// when they commit; a key nobody waits for never notifies. Losing the listening
// connection wakes the waiters (a spurious nil: they claim again). Errors:
// store.ErrInvalid for an ID over MaxIDBytes, ErrNoListener when the Querier is
// not a pool, ctx.Err(), the driver's errors wrapped.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := checkID(id); err != nil {
		return err
	}
	pool, ok := s.db.(acquirer)
	if !ok {
		return fmt.Errorf("idemkey/postgres: wait: %w", ErrNoListener)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l := &s.listen
	payload := waitPayload(id)
	l.mu.Lock()
	if l.keys == nil {
		l.keys = make(map[string]*waitKey)
	}
	wk := l.keys[payload]
	if wk == nil {
		wk = &waitKey{ch: make(chan struct{})}
		l.keys[payload] = wk
	}
	wk.n++
	l.waiters++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	run := l.run
	if run == nil {
		run = s.startListener(pool)
	}
	l.mu.Unlock()
	defer s.unregister(payload, wk)

	select {
	case <-run.ready:
		if run.err != nil {
			return fmt.Errorf("idemkey/postgres: wait: listen: %w", run.err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	tag, err := s.db.Exec(ctx, s.waitSQL, bytesOf(id.Scope), bytesOf(id.Key))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("idemkey/postgres: wait: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil // no live claim: claim again
	}
	select {
	case <-wk.ch:
		return nil
	case <-run.done:
		return nil // the connection is gone: a notification may be lost
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startListener starts a listening connection. Called with l.mu held.
func (s *Store) startListener(pool acquirer) *listenRun {
	l := &s.listen
	ctx, cancel := context.WithCancel(context.Background())
	run := &listenRun{ready: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	l.run = run
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := s.listenLoop(ctx, pool, run)
		cancel()
		l.mu.Lock()
		if l.run == run {
			l.run = nil
		}
		l.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.log().Warn("idemkey/postgres: the waiters' listening connection failed", "table", s.qualified, "err", err)
		}
		close(run.done)
	}()
	return run
}

// listenLoop acquires a connection, listens and dispatches notifications until
// ctx is cancelled or the connection fails.
func (s *Store) listenLoop(ctx context.Context, pool acquirer, run *listenRun) error {
	conn, err := pool.Acquire(ctx)
	if err == nil {
		defer conn.Release()
		_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	}
	run.err = err
	close(run.ready)
	if err != nil {
		return err
	}
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			// Stopped while the connection is healthy: hand it back clean.
			if !conn.Conn().IsClosed() {
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, uerr := conn.Exec(uctx, "UNLISTEN *")
				cancel()
				if uerr != nil {
					conn.Conn().Close(context.Background())
				}
			}
			return nil
		}
		if n.Channel != s.channel {
			continue
		}
		s.listen.mu.Lock()
		if wk := s.listen.keys[n.Payload]; wk != nil {
			close(wk.ch)
			delete(s.listen.keys, n.Payload)
		}
		s.listen.mu.Unlock()
	}
}

// unregister ends one waiter of payload; the last waiter schedules the
// listener's stop.
func (s *Store) unregister(payload string, wk *waitKey) {
	l := &s.listen
	l.mu.Lock()
	defer l.mu.Unlock()
	wk.n--
	if wk.n == 0 && l.keys[payload] == wk {
		delete(l.keys, payload)
	}
	l.waiters--
	if l.waiters > 0 || l.run == nil {
		return
	}
	run := l.run
	if s.listenIdle <= 0 {
		l.run = nil
		run.cancel()
		return
	}
	l.idle = time.AfterFunc(s.listenIdle, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.waiters == 0 && l.run == run {
			l.run = nil
			l.idle = nil
			run.cancel()
		}
	})
}

// StopListener closes the waiters' listening connection now, if open, and waits
// for its goroutine to end; waiters still waiting are woken (they claim again)
// and a later Wait opens it again. Call it when shutting down.
func (s *Store) StopListener() {
	l := &s.listen
	l.mu.Lock()
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.run != nil {
		l.run.cancel()
		l.run = nil
	}
	l.mu.Unlock()
	l.wg.Wait()
}
