package postgres

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// BenchmarkClaimComplete measures claim+complete pairs on fresh keys per second at
// concurrency 1 and 8, through the store and through a plain pgx loop sending the
// same two statements with precomputed arguments (the ceiling; docs/architecture.md section 8
// asks the store for at least 90% of it). Compare the pairs/s metrics of one run:
//
//	DATABASE_URL=... go test -run '^$' -bench ClaimComplete -benchtime 3s ./store/postgres/
func BenchmarkClaimComplete(b *testing.B) {
	pool := newPool(b, "", func(c *pgxpool.Config) { c.MaxConns = 8 })
	ctx := context.Background()
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}}, Body: []byte(`{"id":42,"status":"captured"}`)}
	const lease, retention = 10 * time.Second, time.Hour
	var seq atomic.Int64
	nextID := func() store.ID { return store.ID{Scope: "bench", Key: fmt.Sprintf("key-%d", seq.Add(1))} }

	for _, conc := range []int{1, 8} {
		b.Run(fmt.Sprintf("c%d", conc), func(b *testing.B) {
			ds, ss := newStore(b, pool, nil), newStore(b, pool, nil)
			hdr := codec.EncodeHeader(resp.Header)
			fp := fingerprint("bench")
			direct := func() error {
				id := nextID()
				scope, key, tok := []byte(id.Scope), []byte(id.Key), store.NewToken()
				var (
					claimed, takeover, same, omitted, stale bool
					status                                  pgtype.Int2
					headers, body                           []byte
					created, completed, expires             pgtype.Timestamptz
					retry                                   pgtype.Int8
				)
				if err := pool.QueryRow(ctx, ds.claimSQL, scope, key, fp[:], tok[:], int64(10000), int64(3600000)).Scan(
					&claimed, &takeover, &same, &status, &headers, &body, &omitted, &created, &completed, &expires, &retry, &stale); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, ds.completeSQL, scope, key, tok[:], int16(201), hdr, resp.Body, false, int64(3600000))
				return err
			}
			viaStore := func() error {
				id := nextID()
				res, err := ss.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: lease, Retention: retention})
				if err != nil {
					return err
				}
				if res.Outcome != store.Claimed {
					return fmt.Errorf("outcome %v", res.Outcome)
				}
				return ss.Complete(ctx, id, res.Token, resp, retention)
			}
			interleave(b, conc, direct, viaStore)
		})
	}
}

// interleave runs b.N pairs through direct and b.N through viaStore, alternating
// in chunks (and alternating which goes first) so that load from elsewhere on the
// machine hits both alike, and reports each one's pairs per second and the ratio.
func interleave(b *testing.B, conc int, direct, viaStore func() error) {
	chunk := 8 * conc
	var tDirect, tStore time.Duration
	for done, i := 0, 0; done < b.N; i++ {
		n := min(chunk, b.N-done)
		if i%2 == 0 {
			tDirect += timed(b, conc, n, direct)
			tStore += timed(b, conc, n, viaStore)
		} else {
			tStore += timed(b, conc, n, viaStore)
			tDirect += timed(b, conc, n, direct)
		}
		done += n
	}
	d, s := float64(b.N)/tDirect.Seconds(), float64(b.N)/tStore.Seconds()
	b.ReportMetric(d, "direct-pairs/s")
	b.ReportMetric(s, "store-pairs/s")
	b.ReportMetric(100*s/d, "store-%-of-direct")
}

// timed calls pair n times from conc goroutines and returns the wall time.
func timed(b *testing.B, conc, n int, pair func() error) time.Duration {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  error
	)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := pair(); err != nil {
					errOnce.Do(func() { failed = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	return time.Since(start)
}

// fakeDB answers every claim with "claimed" and every Exec with one row, without
// a server, so BenchmarkOverhead measures the store's own CPU and allocations.
type fakeDB struct{}

func (fakeDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.NewCommandTag("UPDATE 1"), nil
}

func (fakeDB) QueryRow(context.Context, string, ...any) pgx.Row { return claimedRow{} }

type claimedRow struct{}

func (claimedRow) Scan(dest ...any) error {
	*dest[0].(*bool) = true
	return nil
}

// BenchmarkOverhead is the store's work per claim+complete pair beyond the two
// statements: validation, token, argument conversion, header encoding, decoding.
func BenchmarkOverhead(b *testing.B) {
	s, err := New(fakeDB{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}}, Body: []byte(`{"id":42}`)}
	req := store.ClaimRequest{ID: store.ID{Scope: "bench", Key: "key"}, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Hour}
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Claim(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, req.ID, res.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
