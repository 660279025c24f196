package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestWaiting runs the middleware's waiting duplicates over Redis.
func TestWaiting(t *testing.T) {
	c := redistest.Shared(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)), redis.WithWaiterIdle(0))
		t.Cleanup(s.StopWaiters)
		return storetest.WaitSubject{Store: s, Waiting: func() int { return int(s.Stats().Waiters) }}
	})
}

func numSub(t *testing.T, c *goredis.Client, channel string) int64 {
	t.Helper()
	m, err := c.PubSubNumSub(t.Context(), channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

// TestWaitOneSubscriptionPerStore: waiters of several keys share one
// subscription; a key's message wakes its waiters only; the subscription ends
// once the last waiter returned (WithWaiterIdle(0)).
func TestWaitOneSubscriptionPerStore(t *testing.T) {
	c := redistest.Shared(t)
	prefix := redistest.Prefix(t, c)
	s := redis.NewForTest(t, c, redis.WithPrefix(prefix), redis.WithWaiterIdle(0))
	t.Cleanup(s.StopWaiters)
	channel := prefix + "waits"
	const keys, per = 3, 5
	ids := make([]store.ID, keys)
	toks := make([]store.Token, keys)
	for i := range ids {
		ids[i] = store.ID{Scope: "t", Key: "k" + store.NewToken().String()}
		res, err := s.Claim(t.Context(), store.ClaimRequest{ID: ids[i], Fingerprint: store.Fingerprint{1}, Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		toks[i] = res.Token
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	results := make([]chan error, keys)
	for i := range ids {
		results[i] = make(chan error, per)
		for range per {
			go func() { results[i] <- s.Wait(ctx, ids[i]) }()
		}
	}
	// Wait until every record is flagged (the waiters' checks ran).
	deadline := time.Now().Add(10 * time.Second)
	for {
		flagged := 0
		for _, id := range ids {
			if c.GetRange(t.Context(), s.Key(id), 2, 2).Val() == "\x01" { // the marker's waited flag
				flagged++
			}
		}
		if st := s.Stats(); flagged == keys && st.Waiters == keys*per && st.Listening {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters did not register")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := numSub(t, c, channel); n != 1 {
		t.Fatalf("%d subscriptions for %d waiters, want 1", n, keys*per)
	}
	if err := s.Complete(t.Context(), ids[0], toks[0], store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for range per {
		if err := <-results[0]; err != nil {
			t.Fatalf("waiter of the completed key: %v", err)
		}
	}
	select {
	case err := <-results[1]:
		t.Fatalf("a waiter of another key returned: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := s.Release(t.Context(), ids[1], toks[1]); err != nil {
		t.Fatal(err)
	}
	for range per {
		if err := <-results[1]; err != nil {
			t.Fatalf("waiter of the released key: %v", err)
		}
	}
	cancel()
	for range per {
		if err := <-results[2]; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
	}
	s.StopWaiters() // the subscription already ended (idle 0): wait for its goroutine
	if st := s.Stats(); st.Waiters != 0 || st.Listening {
		t.Fatalf("after every waiter returned: %+v", st)
	}
	// The server drops the subscription when it reads the close, on the
	// subscription's own connection: nothing to synchronise on from this one.
	for end := time.Now().Add(5 * time.Second); numSub(t, c, channel) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d subscriptions left", numSub(t, c, channel))
		}
	}
}

// TestWaitPublishesOnlyWaitedKeys: Complete and Release of a key nobody waits
// for publish nothing; a flagged key publishes its record key.
func TestWaitPublishesOnlyWaitedKeys(t *testing.T) {
	c := redistest.Shared(t)
	prefix := redistest.Prefix(t, c)
	s := redis.NewForTest(t, c, redis.WithPrefix(prefix))
	t.Cleanup(s.StopWaiters)
	ps := c.Subscribe(t.Context(), prefix+"waits")
	defer ps.Close()
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatal(err)
	}
	claim := func() (store.ID, store.Token) {
		id := store.ID{Scope: "t", Key: "k" + store.NewToken().String()}
		res, err := s.Claim(t.Context(), store.ClaimRequest{ID: id, Fingerprint: store.Fingerprint{1}, Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		return id, res.Token
	}
	quiet1, qt1 := claim()
	quiet2, qt2 := claim()
	loud1, lt1 := claim()
	loud2, lt2 := claim()
	for _, id := range []store.ID{loud1, loud2} {
		// A Wait that is cancelled right after its check leaves the flag set.
		c.SetRange(t.Context(), s.Key(id), 2, "\x01") // the marker's waited flag
	}
	if err := s.Complete(t.Context(), quiet1, qt1, store.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), quiet2, qt2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), loud1, lt1); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(t.Context(), loud2, lt2, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	c.Publish(t.Context(), prefix+"waits", "end")
	var got []string
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		m, err := ps.ReceiveMessage(ctx)
		cancel()
		if err != nil {
			t.Fatalf("message: %v (got %v)", err, got)
		}
		if m.Payload == "end" {
			break
		}
		got = append(got, m.Payload)
	}
	if want := []string{s.Key(loud1), s.Key(loud2)}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("published %q, want %q (the flagged keys only)", got, want)
	}
}

func BenchmarkWaiting(b *testing.B) {
	c := redistest.Shared(b)
	s := redis.NewForTest(b, c, redis.WithPrefix(redistest.Prefix(b, c)))
	b.Cleanup(s.StopWaiters)
	storetest.BenchWaiting(b, s)
}
