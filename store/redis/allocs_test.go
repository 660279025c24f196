package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestReplayAllocs pins the allocations of a replay (a claim that finds the
// completed record): the command, go-redis's reply, the record and its
// headers. A check on the success path that allocates (errors.As on a nil
// error does) shows here before it shows in a benchmark.
func TestReplayAllocs(t *testing.T) {
	const limit = 12
	if raceEnabled || testing.CoverMode() != "" {
		t.Skip("allocation counts do not hold under the race detector or coverage")
	}
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := NewForTest(t, c)
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: "k"},
		Fingerprint: store.Fingerprint{1}, Lease: 10 * time.Second, Retention: time.Hour}
	r, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"ok":true}`)}
	if err := s.Complete(ctx, req.ID, r.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Completed {
			t.Fatal(res, err)
		}
	})
	if allocs > limit {
		t.Fatalf("a replay allocates %.0f times, want at most %d", allocs, limit)
	}
}
