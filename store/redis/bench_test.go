package redis

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/cputime"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// BenchmarkTransitions compares the store with the ceiling: the same commands sent
// directly through go-redis with prebuilt arguments and no reply decoding. One op is
// three transitions on a fresh key: Claim (new), Complete, Claim (replay). Run both
// at concurrency 1 and 16 against a private redis-server; transitions/s is reported.
//
//	go test -run '^$' -bench Transitions ./store/redis/
func BenchmarkTransitions(b *testing.B) {
	srv := redistest.StartServer(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 32})
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var seq atomic.Int64
	fp := store.Fingerprint{1, 2, 3}
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42,"amountCents":1000}`)}
	s := NewForTest(b, c, WithPrefix("bench:"))

	viaStore := func() error {
		id := store.ID{Scope: "bench", Key: "k" + strconv.FormatInt(seq.Add(1), 10)}
		r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: 10 * time.Second, Retention: time.Minute})
		if err != nil {
			return err
		}
		if err := s.Complete(ctx, id, r.Token, resp, time.Minute); err != nil {
			return err
		}
		_, err = s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: 10 * time.Second, Retention: time.Minute})
		return err
	}
	tok := store.NewToken()
	m := make([]byte, markerLen)
	putMarker(m, fp, tok, time.Now().UnixMilli(), 50000)
	rest, head := recordTail(nil, tok, 0, 60000, resp)
	claim := func(key string) error {
		err := c.SetArgs(ctx, key, m, goredis.SetArgs{Mode: "NX", TTL: time.Minute, Get: true}).Err()
		if err == goredis.Nil {
			return nil
		}
		return err
	}
	direct := func() error {
		key := "bench:{5:benchd" + strconv.FormatInt(seq.Add(1), 10) + "}"
		if err := claim(key); err != nil {
			return err
		}
		if err := completeScript.Run(ctx, c, []string{key}, tok[:], head, rest, resp.Body, 60000, "ch").Err(); err != nil {
			return err
		}
		return claim(key)
	}
	for _, conc := range []int{1, 16} {
		b.Run("c="+strconv.Itoa(conc), func(b *testing.B) {
			// Interleave batches of both so that load from other processes on the
			// machine hits both alike; time each side separately.
			for _, op := range []func() error{direct, viaStore} { // load the scripts
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			const batch = 64
			var spent [2]time.Duration
			var ops [2]int
			b.ReportAllocs()
			for i := 0; i < b.N; i += batch {
				n := min(batch, b.N-i)
				for side, op := range []func() error{direct, viaStore} {
					d, err := runConcurrent(conc, n, op)
					if err != nil {
						b.Fatal(err)
					}
					spent[side] += d
					ops[side] += n
				}
			}
			direct := float64(3*ops[0]) / spent[0].Seconds()
			viaStore := float64(3*ops[1]) / spent[1].Seconds()
			b.ReportMetric(direct, "direct-transitions/s")
			b.ReportMetric(viaStore, "store-transitions/s")
			b.ReportMetric(100*viaStore/direct, "store/direct-%")
		})
	}
}

// runConcurrent runs op n times on conc goroutines and returns the wall time.
func runConcurrent(conc, n int, op func() error) (time.Duration, error) {
	var (
		left atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Value
	)
	left.Store(int64(n))
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := op(); err != nil {
					fail.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	if err, _ := fail.Load().(error); err != nil {
		return d, err
	}
	return d, nil
}

// BenchmarkReplay reports the store's own allocations and CPU time per replay (a Claim that
// finds the completed record), against a private redis-server:
//
//	go test -run '^$' -bench Replay -benchmem ./store/redis/
func BenchmarkReplay(b *testing.B) {
	srv := redistest.StartServer(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := NewForTest(b, c, WithPrefix("bench:"))
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: "0b6f0d2c-3d4e-4c8a-9d1e-2f3a4b5c6d7e"},
		Fingerprint: store.Fingerprint{1, 2, 3}, Lease: 10 * time.Second, Retention: time.Hour}
	r, err := s.Claim(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	if err := s.Complete(ctx, req.ID, r.Token, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer cputime.PerOp(b)()
	for b.Loop() {
		if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Completed {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkFirstExecution reports the store's own allocations per first
// execution (a Claim of a new key, then Complete), against a private
// redis-server:
//
//	go test -run '^$' -bench FirstExecution -benchmem ./store/redis/
func BenchmarkFirstExecution(b *testing.B) {
	srv := redistest.StartServer(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := NewForTest(b, c, WithPrefix("bench:"))
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	req := store.ClaimRequest{Fingerprint: store.Fingerprint{1, 2, 3}, Lease: 10 * time.Second, Retention: time.Hour}
	// A new key per op: the benchmark's own two allocations (Itoa, concat)
	// are counted too.
	req.ID.Scope = "tenant-1"
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	b.ReportAllocs()
	defer cputime.PerOp(b)()
	for i := 0; b.Loop(); i++ {
		req.ID.Key = prefix + strconv.Itoa(i)
		r, err := s.Claim(ctx, req)
		if err != nil || r.Outcome != store.Claimed {
			b.Fatal(r, err)
		}
		if err := s.Complete(ctx, req.ID, r.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
