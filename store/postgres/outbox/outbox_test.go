package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres/outbox"
)

// pool connects to DATABASE_URL (a failure when CI=true and it is unset, a skip
// otherwise) and closes the pool when the test ends.
func pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	p, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// newOutbox returns a migrated outbox in a schema of its own, dropped at the end.
func newOutbox(t testing.TB, p *pgxpool.Pool, opts ...outbox.Option) *outbox.Outbox {
	t.Helper()
	schema := "idemkey_outbox_test_" + store.NewToken().String()[:12]
	ob, err := outbox.New(p, append([]outbox.Option{outbox.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if _, err := p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := ob.Migrate(t.Context()); err != nil { // idempotent
		t.Fatalf("Migrate again: %v", err)
	}
	return ob
}

// enqueue commits messages ids in one transaction, or rolls it back.
func enqueue(t *testing.T, p *pgxpool.Pool, ob *outbox.Outbox, commit bool, ids ...string) {
	t.Helper()
	if err := tryEnqueue(t.Context(), p, ob, commit, ids...); err != nil {
		t.Fatal(err)
	}
}

// tryEnqueue is enqueue returning its error, for other goroutines than the test's.
func tryEnqueue(ctx context.Context, p *pgxpool.Pool, ob *outbox.Outbox, commit bool, ids ...string) error {
	tx, err := p.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	for _, id := range ids {
		ok, err := ob.Enqueue(ctx, tx, outbox.Message{ID: id, Topic: "t." + id, Payload: []byte("body of " + id)})
		if err != nil || !ok {
			return fmt.Errorf("Enqueue(%s) = %v, %v", id, ok, err)
		}
	}
	if commit {
		return tx.Commit(ctx)
	}
	return nil
}

// recorder is a PublishFunc that records what it was given.
type recorder struct {
	mu   sync.Mutex
	msgs []outbox.Message
	fail func(outbox.Message) error
}

func (r *recorder) publish(_ context.Context, m outbox.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(m); err != nil {
			return err
		}
	}
	r.msgs = append(r.msgs, m)
	return nil
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = m.ID
	}
	return out
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// TestRolledBackSendsNothing: messages enqueued in transactions that roll back
// are never published; those of committed ones are, in order, with their topic
// and payload, and are gone afterwards.
func TestRolledBackSendsNothing(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p)
	enqueue(t, p, ob, false, ids("rolled-back", 20)...)
	var r recorder
	if n, err := ob.RelayBatch(t.Context(), r.publish); n != 0 || err != nil || len(r.ids()) != 0 {
		t.Fatalf("RelayBatch after a rollback = %d, %v, published %v; want nothing", n, err, r.ids())
	}
	enqueue(t, p, ob, true, "a", "b")
	enqueue(t, p, ob, false, "c")
	enqueue(t, p, ob, true, "d")
	if n, err := ob.RelayBatch(t.Context(), r.publish); n != 3 || err != nil {
		t.Fatalf("RelayBatch = %d, %v; want 3", n, err)
	}
	if got := fmt.Sprint(r.ids()); got != "[a b d]" {
		t.Fatalf("published %s, want [a b d]", got)
	}
	if m := r.msgs[2]; m.Topic != "t.d" || string(m.Payload) != "body of d" || m.CreatedAt.IsZero() {
		t.Fatalf("published %+v", m)
	}
	if n, err := ob.Pending(t.Context()); n != 0 || err != nil {
		t.Fatalf("Pending = %d, %v; want 0", n, err)
	}
}

// TestPublishFailureKeepsTheRest: a publish that fails on one message of a batch
// deletes those before it and keeps it and the rest, which the next batch
// publishes in order: every message is published, none is lost.
func TestPublishFailureKeepsTheRest(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p, outbox.WithBatchSize(10))
	all := ids("m", 25)
	enqueue(t, p, ob, true, all...)
	errBroker := errors.New("broker down")
	failed := map[string]bool{}
	r := recorder{fail: func(m outbox.Message) error {
		if (m.ID == "m-0004" || m.ID == "m-0017") && !failed[m.ID] {
			failed[m.ID] = true
			return errBroker
		}
		return nil
	}}
	var counts []int
	for range 10 {
		n, err := ob.RelayBatch(t.Context(), r.publish)
		if err != nil && !errors.Is(err, errBroker) {
			t.Fatal(err)
		}
		counts = append(counts, n)
		if n == 0 && err == nil {
			break
		}
	}
	if got, want := fmt.Sprint(r.ids()), fmt.Sprint(all); got != want {
		t.Fatalf("published %s\nwant %s (batches %v)", got, want, counts)
	}
	if fmt.Sprint(counts) != "[4 10 3 8 0]" {
		t.Fatalf("batches published %v, want [4 10 3 8 0]", counts)
	}
}

// TestEnqueueDuplicateID: a second message with the ID of one still waiting is
// not enqueued (the first stays), and bad messages are refused.
func TestEnqueueDuplicateID(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p)
	enqueue(t, p, ob, true, "once")
	ok, err := ob.Enqueue(t.Context(), p, outbox.Message{ID: "once", Topic: "other"})
	if ok || err != nil {
		t.Fatalf("Enqueue of a waiting ID = %v, %v; want false, nil", ok, err)
	}
	for _, m := range []outbox.Message{{Topic: "t"}, {ID: "x"}, {ID: "a\x00b", Topic: "t"}, {ID: "\xff", Topic: "t"}} {
		if _, err := ob.Enqueue(t.Context(), p, m); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("Enqueue(%+v) = %v; want store.ErrInvalid", m, err)
		}
	}
}

// TestConcurrentRelays: four relays on one outbox while producers enqueue
// publish every committed message exactly once (no crash: SKIP LOCKED shares
// the rows, nothing is published twice) and none of the rolled-back ones.
func TestConcurrentRelays(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p, outbox.WithBatchSize(7), outbox.WithPollInterval(5*time.Millisecond))
	var r recorder
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = ob.Relay(ctx, r.publish) })
	}
	const producers, each = 4, 50
	var pw sync.WaitGroup
	for w := range producers {
		pw.Go(func() {
			for i := range each {
				if err := tryEnqueue(t.Context(), p, ob, i%5 != 0, fmt.Sprintf("w%d-%d", w, i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	pw.Wait()
	deadline := time.Now().Add(5 * time.Minute) // a bound for a hang; a busy machine only slows this down
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-10 * time.Second)
	}
	for {
		n, err := ob.Pending(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	seen := map[string]int{}
	for _, id := range r.ids() {
		seen[id]++
	}
	for w := range producers {
		for i := range each {
			id, want := fmt.Sprintf("w%d-%d", w, i), 1
			if i%5 == 0 {
				want = 0
			}
			if seen[id] != want {
				t.Fatalf("%s published %d times, want %d", id, seen[id], want)
			}
		}
	}
}

// TestNewRefusesBadOptions: misconfigurations fail at construction.
func TestNewRefusesBadOptions(t *testing.T) {
	for _, opts := range [][]outbox.Option{
		{outbox.WithTable("")}, {outbox.WithTable(string(make([]byte, 49)))}, {outbox.WithBatchSize(0)},
		{outbox.WithPollInterval(0)}, {outbox.WithRetryDelay(-1)}, {outbox.WithSchema("a\x00")},
	} {
		if _, err := outbox.New(&pgxpool.Pool{}, opts...); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("New with bad options = %v; want store.ErrInvalid", err)
		}
	}
	if _, err := outbox.New(nil); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("New(nil) = %v", err)
	}
}

// BenchmarkRelay measures the relay's own cost per message (a publish that does
// nothing): the batch's SELECT ... FOR UPDATE SKIP LOCKED, DELETE and COMMIT
// shared by the batch's messages. Enqueue's cost is one INSERT in the caller's
// transaction.
func BenchmarkRelay(b *testing.B) {
	for _, size := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			p := pool(b)
			ob := newOutbox(b, p, outbox.WithBatchSize(size))
			ctx := context.Background()
			tx, err := p.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for i := range b.N {
				if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: fmt.Sprint(i), Topic: "t", Payload: []byte("receipt")}); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			noop := func(context.Context, outbox.Message) error { return nil }
			b.ResetTimer()
			for done := 0; done < b.N; {
				n, err := ob.RelayBatch(ctx, noop)
				if err != nil || n == 0 {
					b.Fatalf("RelayBatch = %d, %v after %d of %d", n, err, done, b.N)
				}
				done += n
			}
		})
	}
}

// TestStoppedRelayKeepsWhatWasPublished: a relay whose context ends in the
// middle of a batch (a graceful stop) still deletes the messages the broker
// took, so a restart does not publish them again; the rest stay.
func TestStoppedRelayKeepsWhatWasPublished(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p)
	enqueue(t, p, ob, true, ids("s", 10)...)
	ctx, cancel := context.WithCancel(t.Context())
	r := recorder{fail: func(m outbox.Message) error {
		if m.ID == "s-0004" {
			cancel() // the stop arrives while the fifth message is being published
			return context.Canceled
		}
		return nil
	}}
	if n, err := ob.RelayBatch(ctx, r.publish); n != 4 || !errors.Is(err, context.Canceled) {
		t.Fatalf("RelayBatch = %d, %v; want 4, context.Canceled", n, err)
	}
	if n, err := ob.Pending(t.Context()); n != 6 || err != nil {
		t.Fatalf("Pending = %d, %v; want the 6 unpublished", n, err)
	}
}

// TestAlwaysRefusedMessageHoldsTheRest: a message the broker always refuses
// keeps its place, and every later message waits behind it (the relay keeps
// the order), visible in Pending, until the row or the broker is fixed.
func TestAlwaysRefusedMessageHoldsTheRest(t *testing.T) {
	p := pool(t)
	ob := newOutbox(t, p, outbox.WithBatchSize(2))
	enqueue(t, p, ob, true, "a", "poison", "b", "c")
	errTooLarge := errors.New("message too large")
	r := recorder{fail: func(m outbox.Message) error {
		if m.ID == "poison" {
			return errTooLarge
		}
		return nil
	}}
	for range 3 {
		if _, err := ob.RelayBatch(t.Context(), r.publish); err != nil && !errors.Is(err, errTooLarge) {
			t.Fatal(err)
		}
	}
	if n, err := ob.Pending(t.Context()); fmt.Sprint(r.ids()) != "[a]" || n != 3 || err != nil {
		t.Fatalf("published %v, %d pending (%v); want [a] and 3 waiting behind the refused one", r.ids(), n, err)
	}
	if _, err := p.Exec(t.Context(), `DELETE FROM `+ob.Table()+` WHERE message_id = 'poison'`); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.RelayBatch(t.Context(), r.publish); n != 2 || err != nil || fmt.Sprint(r.ids()) != "[a b c]" {
		t.Fatalf("after deleting it: RelayBatch = %d, %v, published %v; want the rest", n, err, r.ids())
	}
}
