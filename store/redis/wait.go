package redis

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// DefaultWaiterIdle is how long the waiters' subscription stays open after
// the last waiter left (WithWaiterIdle).
const DefaultWaiterIdle = 30 * time.Second

// WithWaiterIdle sets how long the subscription Wait listens on stays open
// after the last waiter returned (default DefaultWaiterIdle; 0 or less:
// closed at once).
func WithWaiterIdle(d time.Duration) Option { return func(s *Store) { s.waiters.Idle = d } }

// WithLogger sets the logger told of a failed waiters' subscription (nil:
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l == nil {
			l = slog.Default()
		}
		s.waiters.OnError = func(err error) {
			l.Warn("idemkey/store/redis: the waiters' subscription failed", "channel", s.channel, "err", err)
		}
	}
}

// Wait implements store.Waiter with Redis pub/sub: one subscription per store,
// to the channel "<prefix>waits", whatever the number of waiters (open while
// anyone waits and WithWaiterIdle after); the message of a key wakes all its
// waiters in this process. It registers, makes sure the subscription is
// confirmed, then flags the record as waited for in one script (the check): no
// live claim returns nil at once. Complete and Release of a flagged marker
// PUBLISH its key from their script; a key nobody waits for publishes nothing,
// and the server's notify-keyspace-events setting is not needed. A resubscription
// after a lost connection wakes every waiter (a spurious nil: they claim again).
// Errors: store.ErrInvalid for an invalid ID (ID.Validate), store.ErrCorrupt for foreign data
// under the key, ctx.Err(), the client's errors wrapped.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if s.client == nil {
		return fmt.Errorf("idemkey/store/redis: %w: nil client", store.ErrInvalid)
	}
	key := keyFor(s.prefix, id)
	return s.waiters.Wait(ctx, key, func(ctx context.Context) (bool, error) {
		v, err := s.run(ctx, "wait", waitScript, key)
		if err != nil {
			return false, err
		}
		if _, code, err := asReply(v); err == nil && code == -2 {
			return s.legacyWait(ctx, key)
		}
		return waitReply(v)
	})
}

// waitReply decodes the reply of waitScript or legacyWaitScript: whether a live
// claim was flagged as waited for.
func waitReply(v any) (bool, error) {
	_, code, err := asReply(v)
	switch {
	case err != nil:
		return false, err
	case code == 1:
		return true, nil
	case code == 0:
		return false, nil
	}
	return false, corrupt("wait reply code")
}

// subscribe is the waiters' subscription (waitset.Listen).
func (s *Store) subscribe(ctx context.Context, set *waitset.Set, ready func(error)) error {
	ps := s.client.Subscribe(ctx, s.channel)
	defer ps.Close()
	// The confirmation: from here on every PUBLISH on the channel reaches us.
	if _, err := ps.Receive(ctx); err != nil {
		err = fmt.Errorf("idemkey/store/redis: wait: subscribe: %w", err)
		ready(err)
		return err
	}
	ready(nil)
	msgs := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("idemkey/store/redis: wait: subscription closed")
			}
			switch m := m.(type) {
			case *goredis.Message:
				if m.Channel == s.channel {
					set.Notify(m.Payload)
				}
			case *goredis.Subscription:
				// A resubscription after a reconnect: messages sent in between are lost.
				set.NotifyAll()
			}
		}
	}
}

// StopWaiters closes the waiters' subscription now, if open, and waits for it
// to end; waiters still waiting are woken (they claim again) and a later Wait
// subscribes again. Call it when shutting down, after the last request.
func (s *Store) StopWaiters() { s.waiters.Stop() }

// Stats are the store's own counters, as postgres.Stats names them.
type Stats struct {
	// Waiters is the number of Wait calls in progress (duplicates waiting for a
	// claim in flight), and Listening whether their subscription is open.
	Waiters   int64
	Listening bool
}

// Stats returns the counters. It is safe to call concurrently with every other
// method and does no I/O.
func (s *Store) Stats() Stats {
	n, on := s.waiters.Stats()
	return Stats{Waiters: int64(n), Listening: on}
}
