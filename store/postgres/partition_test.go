package postgres

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

const testEpoch = time.Hour

func TestConformancePartitioned(t *testing.T) {
	pool := newPool(t, "")
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: newStore(t, pool, nil, WithPartitions(testEpoch))}
	})
}

func TestPartitionsRejectBadConfig(t *testing.T) {
	db := (*pgxpool.Pool)(nil)
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"short epoch", []Option{WithPartitions(30 * time.Second)}},
		{"long epoch", []Option{WithPartitions(400 * 24 * time.Hour)}},
		{"fractional epoch", []Option{WithPartitions(90500 * time.Millisecond)}},
		{"negative epoch", []Option{WithPartitions(-time.Hour)}},
		{"transaction pooler", []Option{WithPartitions(time.Hour), WithTransactionPooler()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(db, tc.opts...); !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("New: %v, want ErrInvalid", err)
			}
		})
	}
	s, err := New(db, WithPartitions(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OneTx(&pgxpool.Pool{}); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "partitioned") {
		t.Fatalf("OneTx: %v, want ErrInvalid naming the layout", err)
	}
}

// TestMigrateRefusesOtherLayout: Migrate of a store whose layout or epoch differs
// from the existing table's fails with store.ErrInvalid and changes nothing.
func TestMigrateRefusesOtherLayout(t *testing.T) {
	pool := newPool(t, "")
	plain := newStore(t, pool, nil)
	part := newStore(t, pool, nil, WithPartitions(testEpoch))
	for _, tc := range []struct {
		name   string
		schema string
		opts   []Option
	}{
		{"partitioned on plain", plain.schema, []Option{WithPartitions(testEpoch)}},
		{"plain on partitioned", part.schema, nil},
		{"other epoch", part.schema, []Option{WithPartitions(2 * testEpoch)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(pool, append([]Option{WithSchema(tc.schema)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("Migrate: %v, want ErrInvalid", err)
			}
		})
	}
	if err := part.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate of the same layout: %v", err)
	}
}

// partEnv is a partitioned store with helpers to place records in past epochs.
type partEnv struct {
	t    *testing.T
	pool *pgxpool.Pool
	s    *Store
	cur  int64
}

func newPartEnv(t *testing.T) *partEnv {
	pool := newPool(t, "")
	e := &partEnv{t: t, pool: pool, s: newStore(t, pool, nil, WithPartitions(testEpoch))}
	if err := pool.QueryRow(t.Context(), `SELECT floor(extract(epoch FROM clock_timestamp()) / $1)::bigint`,
		int64(testEpoch.Seconds())).Scan(&e.cur); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *partEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *partEnv) part(epoch int64) string { return e.s.ident(fmt.Sprintf("%s_p%d", e.s.table, epoch)) }

// addPartition creates the partition of a past epoch.
func (e *partEnv) addPartition(epoch int64) {
	e.exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%d) TO (%d)`, e.part(epoch), e.s.Table(), epoch, epoch+1))
}

// moveTo moves id's record to the partition of epoch, as if claimed then.
func (e *partEnv) moveTo(id store.ID, epoch int64) {
	e.exec(`UPDATE `+e.s.Table()+` SET epoch = $3 WHERE scope = $1 AND key = $2`, []byte(id.Scope), []byte(id.Key), epoch)
}

func (e *partEnv) hasPartition(epoch int64) bool {
	var ok bool
	if err := e.pool.QueryRow(e.t.Context(), `SELECT to_regclass($1) IS NOT NULL`, e.part(epoch)).Scan(&ok); err != nil {
		e.t.Fatal(err)
	}
	return ok
}

func (e *partEnv) rows(id store.ID) int {
	var n int
	if err := e.pool.QueryRow(e.t.Context(), `SELECT count(*) FROM `+e.s.Table()+` WHERE scope = $1 AND key = $2`,
		[]byte(id.Scope), []byte(id.Key)).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// claimDone claims and completes id (status 201, body "done").
func (e *partEnv) claimDone(id store.ID, retention time.Duration) {
	e.t.Helper()
	res, err := e.s.Claim(e.t.Context(), claimReq(id, retention))
	if err != nil || res.Outcome != store.Claimed {
		e.t.Fatalf("claim: %+v %v", res, err)
	}
	if err := e.s.Complete(e.t.Context(), id, res.Token, store.Response{Status: 201, Header: http.Header{}, Body: []byte("done")}, retention); err != nil {
		e.t.Fatalf("complete: %v", err)
	}
}

func claimReq(id store.ID, retention time.Duration) store.ClaimRequest {
	return store.ClaimRequest{ID: id, Fingerprint: fingerprint("fp"), Lease: time.Minute, Retention: retention}
}

// TestPartitionSweep: the sweep drops a past partition whose records all
// expired, keeps one with a live record, keeps the previous epoch's (whose
// record still replays) and creates the partitions of the next epochs.
func TestPartitionSweep(t *testing.T) {
	e := newPartEnv(t)
	ctx := t.Context()
	old, kept, prev := e.cur-3, e.cur-2, e.cur-1
	for _, n := range []int64{old, kept, prev} {
		e.addPartition(n)
	}
	expired, live, recent := newID(), newID(), newID()
	for _, c := range []struct {
		id    store.ID
		epoch int64
	}{{expired, old}, {live, kept}, {recent, prev}} {
		e.claimDone(c.id, time.Hour)
		e.moveTo(c.id, c.epoch)
	}
	e.exec(`UPDATE `+e.s.Table()+` SET expires_at = now() - interval '1 second' WHERE scope = $1 AND key = $2`, []byte(expired.Scope), []byte(expired.Key))
	e.exec(`DROP TABLE ` + e.part(e.cur+2)) // the sweep creates it again
	if _, err := e.s.Sweep(ctx, 0); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	for n, want := range map[int64]bool{old: false, kept: true, prev: true, e.cur: true, e.cur + 1: true, e.cur + 2: true} {
		if got := e.hasPartition(n); got != want {
			t.Errorf("partition of epoch %+d: exists %v, want %v", n-e.cur, got, want)
		}
	}
	res, err := e.s.Claim(ctx, claimReq(recent, time.Hour))
	if err != nil || res.Outcome != store.Completed || res.Record == nil || string(res.Record.Body) != "done" {
		t.Fatalf("claim of the previous epoch's record: %+v %v, want its replay", res, err)
	}
	e.exec(`UPDATE `+e.s.Table()+` SET expires_at = now() - interval '1 second' WHERE epoch = $1`, kept)
	if _, err := e.s.Sweep(ctx, 0); err != nil || e.hasPartition(kept) {
		t.Fatalf("second sweep: %v, partition kept: %v", err, e.hasPartition(kept))
	}
}

// TestPartitionBoundaryClaims: claims of keys whose records are in the previous
// epoch's partition find them: duplicates of one in flight are answered in
// flight, of an expired one exactly one claims (and the old row is gone), of one
// whose lease expired exactly one takes over; of a new key exactly one claims
// (the advisory lock stands in for the primary key).
func TestPartitionBoundaryClaims(t *testing.T) {
	e := newPartEnv(t)
	ctx := t.Context()
	e.addPartition(e.cur - 1)
	inflight, expired, lapsed := newID(), newID(), newID()
	for _, id := range []store.ID{inflight, expired, lapsed} {
		if res, err := e.s.Claim(ctx, claimReq(id, time.Hour)); err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		e.moveTo(id, e.cur-1)
	}
	e.exec(`UPDATE `+e.s.Table()+` SET expires_at = now() - interval '1 second' WHERE scope = $1 AND key = $2`, []byte(expired.Scope), []byte(expired.Key))
	e.exec(`UPDATE `+e.s.Table()+` SET lease_until = now() - interval '1 second' WHERE scope = $1 AND key = $2`, []byte(lapsed.Scope), []byte(lapsed.Key))
	for _, c := range []struct {
		id      store.ID
		claimed int
	}{{inflight, 0}, {expired, 1}, {lapsed, 1}, {newID(), 1}} {
		const n = 16
		var wg sync.WaitGroup
		outcomes := make(chan store.Outcome, n)
		for range n {
			wg.Go(func() {
				res, err := e.s.Claim(ctx, claimReq(c.id, time.Hour))
				if err != nil {
					t.Error(err)
				}
				outcomes <- res.Outcome
			})
		}
		wg.Wait()
		close(outcomes)
		claimed := 0
		for o := range outcomes {
			if o == store.Claimed {
				claimed++
			} else if o != store.InFlight {
				t.Errorf("outcome %v, want claimed or in flight", o)
			}
		}
		if claimed != c.claimed || e.rows(c.id) != 1 {
			t.Errorf("%d of %d claims won, want %d; %d rows for the key, want 1", claimed, n, c.claimed, e.rows(c.id))
		}
	}
}

// TestPartitionMissingCreated: a claim in an epoch whose partition is missing
// (no sweep ran) creates it and succeeds.
func TestPartitionMissingCreated(t *testing.T) {
	e := newPartEnv(t)
	e.exec(`ALTER TABLE ` + e.s.Table() + ` DETACH PARTITION ` + e.part(e.cur))
	e.exec(`DROP TABLE ` + e.part(e.cur))
	if res, err := e.s.Claim(t.Context(), claimReq(newID(), time.Hour)); err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if !e.hasPartition(e.cur) {
		t.Fatal("the current partition was not created")
	}
}

// TestPartitionConcurrentSweeps: stores of one table sweeping at once all
// succeed and the expired partition is dropped.
func TestPartitionConcurrentSweeps(t *testing.T) {
	e := newPartEnv(t)
	e.addPartition(e.cur - 5)
	e.addPartition(e.cur - 4)
	other, err := New(e.pool, WithSchema(e.s.schema), WithPartitions(testEpoch))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		s := []*Store{e.s, other}[i%2]
		wg.Go(func() {
			if _, err := s.Sweep(t.Context(), 0); err != nil {
				t.Errorf("sweep: %v", err)
			}
		})
	}
	wg.Wait()
	if _, err := e.s.Sweep(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if e.hasPartition(e.cur-5) || e.hasPartition(e.cur-4) {
		t.Fatal("expired partitions left")
	}
}

// TestPartitionedMigrationSQL: the SQL of MigrationSQL, run by hand, gives a
// working store, and Migrate accepts the table afterwards.
func TestPartitionedMigrationSQL(t *testing.T) {
	e := newPartEnv(t)
	s, err := New(e.pool, WithSchema(e.s.schema), WithTable("by_hand"), WithPartitions(testEpoch))
	if err != nil {
		t.Fatal(err)
	}
	e.exec(s.MigrationSQL())
	if res, err := s.Claim(t.Context(), claimReq(newID(), time.Hour)); err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate after MigrationSQL: %v", err)
	}
}
