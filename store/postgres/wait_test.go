package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestWaiting runs the middleware's waiting duplicates over Postgres.
func TestWaiting(t *testing.T) {
	pool := newPool(t, "")
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		s := newStore(t, pool, nil, WithWaiterIdle(0))
		return storetest.WaitSubject{Store: s, Waiting: func() int { return int(s.Stats().Waiters) }}
	})
}

// listeners counts the sessions listening on the store's channel.
func listeners(t *testing.T, s *Store, db Querier) int {
	t.Helper()
	var n int
	if err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE query = $1`,
		"LISTEN "+pgx.Identifier{s.channel}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWaitOneListenerPerStore: any number of waiters on any number of keys share
// one listening connection; one notification wakes every waiter of its key and
// no other; once the last waiter returns the connection is handed back
// (WithWaiterIdle(0)) and its goroutine ends.
func TestWaitOneListenerPerStore(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil, WithWaiterIdle(0))
	const keys, per = 3, 5
	ids := make([]store.ID, keys)
	toks := make([]store.Token, keys)
	for i := range ids {
		ids[i] = newID()
		res, err := s.Claim(t.Context(), store.ClaimRequest{ID: ids[i], Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour})
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
	// Every waiter registers, then flags the row; wait until all did (the flags
	// are visible in the table).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var flagged int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE waiters`).Scan(&flagged); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); flagged == keys && st.Waiters == keys*per && st.Listening {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters did not register: %+v, %d rows flagged", s.Stats(), flagged)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := listeners(t, s, pool); n != 1 {
		t.Fatalf("%d sessions listen for %d waiters, want 1", n, keys*per)
	}
	// Completing key 0 wakes its waiters only.
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
	// Releasing key 1 wakes its waiters; cancelling the rest returns them.
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
	s.StopWaiters() // waits for the listening goroutine, already stopped (WithWaiterIdle(0))
	if st := s.Stats(); st.Waiters != 0 || st.Listening {
		t.Fatalf("after every waiter returned: %+v", st)
	}
	// The client has closed its connection; the server's backend leaves
	// pg_stat_activity when it exits, a moment later and on its own schedule,
	// so this is the one place the test polls (the server gives no signal).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := listeners(t, s, pool)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still listen 10s after the listener closed", n)
		}
	}
}

// TestWaitNotifiesOnlyWaitedKeys: Complete and Release of a key nobody waits for
// send no notification; a flagged key notifies once its transaction commits
// (CompleteTx included).
func TestWaitNotifiesOnlyWaitedKeys(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(t.Context(), "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "UNLISTEN *")
	claim := func() (store.ID, store.Token) {
		id := newID()
		res, err := s.Claim(t.Context(), store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		return id, res.Token
	}
	flag := func(id store.ID) {
		if tag, err := pool.Exec(t.Context(), s.waitSQL, []byte(id.Scope), []byte(id.Key)); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("flag: %v %v", tag, err)
		}
	}
	quiet1, qt1 := claim()
	quiet2, qt2 := claim()
	loud1, lt1 := claim()
	loud2, lt2 := claim()
	flag(loud1)
	flag(loud2)
	if err := s.Complete(t.Context(), quiet1, qt1, store.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), quiet2, qt2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), loud1, lt1); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteTx(t.Context(), tx, loud2, lt2, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		n, err := conn.Conn().WaitForNotification(ctx)
		cancel()
		if err != nil {
			t.Fatalf("notification: %v (got %v)", err, got)
		}
		got = append(got, n.Payload)
	}
	if want := []string{waitPayload(loud1), waitPayload(loud2)}; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("notifications %v, want %v (the flagged keys only, in commit order)", got, want)
	}
	// Nothing else was sent: a NOTIFY of our own arrives next.
	if _, err := pool.Exec(t.Context(), `SELECT pg_notify($1, 'end')`, s.channel); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(ctx); err != nil || n.Payload != "end" {
		t.Fatalf("next notification %v %v, want the end marker", n, err)
	}
}

// TestWaitNeedsPool: a store on a single connection cannot lend one to listen.
func TestWaitNeedsPool(t *testing.T) {
	pool := newPool(t, "")
	conn, err := pgx.Connect(t.Context(), databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s := newStore(t, pool, conn)
	if err := s.Wait(t.Context(), newID()); !errors.Is(err, ErrNoListener) {
		t.Fatalf("Wait on a *pgx.Conn store = %v, want ErrNoListener", err)
	}
}

func BenchmarkWaiting(b *testing.B) {
	pool := newPool(b, "")
	storetest.BenchWaiting(b, newStore(b, pool, nil))
}
