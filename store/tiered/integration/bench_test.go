package tiered_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// BenchmarkReplay measures the latency of a replay (a claim answered Completed)
// through the tiered store (1 Redis round trip) against the Postgres store alone (1
// statement), interleaving the two so machine load hits both alike. Needs
// DATABASE_URL; Redis is a private server.
//
//	go test -run '^$' -bench Replay ./store/tiered/
func BenchmarkReplay(b *testing.B) {
	pg := postgresBackstop(b, pgPool(b))
	srv := redistest.StartServer(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	tier := mustTiered(b, mustRedis(b, c), pg)
	ctx := context.Background()
	id := store.ID{Scope: "tenant", Key: "replayed"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: 10 * time.Second, Retention: time.Hour}
	r, err := tier.Claim(ctx, req)
	if err != nil || r.Outcome != store.Claimed {
		b.Fatalf("claim: %+v %v", r, err)
	}
	body := []byte(`{"balanceCents":1000,"aggregateVersion":7}`)
	if err := tier.Complete(ctx, id, r.Token, store.Response{Status: 200, Body: body}, time.Hour); err != nil {
		b.Fatal(err)
	}
	sides := []store.Store{tier, pg}
	var spent [2]time.Duration
	for _, s := range sides { // warm: prepared statement, script cache
		if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.Completed {
			b.Fatalf("replay: %+v %v", r, err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for side, s := range sides {
			start := time.Now()
			r, err := s.Claim(ctx, req)
			spent[side] += time.Since(start)
			if err != nil || r.Outcome != store.Completed {
				b.Fatalf("replay %d: %+v %v", i, r, err)
			}
		}
	}
	b.StopTimer()
	tierNs := float64(spent[0].Nanoseconds()) / float64(b.N)
	pgNs := float64(spent[1].Nanoseconds()) / float64(b.N)
	b.ReportMetric(tierNs/1000, "tiered-µs/replay")
	b.ReportMetric(pgNs/1000, "postgres-µs/replay")
	b.ReportMetric(pgNs/tierNs, "postgres/tiered-x")
	if st := tier.Stats(); st.FastMisses > 1 || st.FastErrors > 0 {
		b.Errorf("replays left the fast path: %+v", st)
	}
}
