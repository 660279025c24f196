package redis_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestEvictedMidFlight (private server, maxmemory 3mb allkeys-random:
// about 45 keys fit, so the marker goes within a few hundred writes whatever
// the check touches): a marker the server evicts while its handler runs
// leaves the holder's
// Complete, Renew and Release refused as lease lost (never a record written
// for a claim that no longer exists, never another error), and
// CheckEvictionPolicy names the policy that allowed it.
func TestEvictedMidFlight(t *testing.T) {
	srv := redistest.StartServer(t, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-random")
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	s := redis.NewForTest(t, c)
	if err := s.CheckEvictionPolicy(ctx); !errors.Is(err, redis.ErrEvictionPolicy) {
		t.Errorf("CheckEvictionPolicy: %v", err)
	}
	id := store.ID{Key: "evicted"}
	held := mustClaim(t, s, store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Minute, Retention: time.Hour})
	filler := strings.Repeat("x", 64<<10)
	for i := 0; c.Exists(ctx, s.Key(id)).Val() == 1; i++ {
		if i > 2000 {
			t.Fatal("the marker was never evicted")
		}
		if err := c.Set(ctx, "filler:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for op, err := range map[string]error{
		"Complete": s.Complete(ctx, id, held.Token, store.Response{Status: 200}, time.Minute),
		"Renew":    s.Renew(ctx, id, held.Token, time.Minute),
		"Release":  s.Release(ctx, id, held.Token),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s after eviction: %v, want ErrLeaseLost", op, err)
		}
	}
	if n := c.Exists(ctx, s.Key(id)).Val(); n != 0 {
		t.Errorf("a refused call wrote the key")
	}
}

// fillMemory puts the server (noeviction) over its maxmemory for good: the
// limit drops below what it holds.
func fillMemory(t *testing.T, c *goredis.Client) {
	t.Helper()
	if err := c.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(t.Context(), "filler", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("not out of memory: %v", err)
	}
}

// TestOutOfMemory (private server, noeviction, over its maxmemory): no
// call half-writes. The completion of a claim fails with the server's error
// and leaves the marker as it was; the holder may still release it (DEL
// frees memory).
func TestOutOfMemory(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	s := redis.NewForTest(t, c)
	id := store.ID{Key: "held"}
	req := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Minute, Retention: time.Hour}
	held := mustClaim(t, s, req)
	before := c.Get(ctx, s.Key(id)).Val()
	fillMemory(t, c)
	body := []byte(strings.Repeat("b", 64<<10))
	if err := s.Complete(ctx, id, held.Token, store.Response{Status: 200, Body: body}, time.Minute); err == nil || errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete when out of memory: %v, want the server's error", err)
	}
	if err := s.Renew(ctx, id, held.Token, time.Second); err == nil || errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew when out of memory: %v, want the server's error", err)
	}
	if got := c.Get(ctx, s.Key(id)).Val(); got != before {
		t.Errorf("the marker changed: %q", got)
	}
	if err := s.Release(ctx, id, held.Token); err != nil {
		t.Errorf("Release when out of memory: %v", err)
	}
}

// TestReplayWhenFull (private server, noeviction, over its maxmemory):
// a claim that needs no write (the replay of a completed record, a duplicate
// of a claim in flight, a mismatch) is answered as Peek answers it; only a
// claim that must write fails. The claim's SET NX GET is refused whole by a
// full server (SET is a deny-OOM command even when NX finds the key), where
// the script claim of the previous format (compat-mode EVAL: refused only at
// its first write) replayed.
func TestReplayWhenFull(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	s := redis.NewForTest(t, c)
	done := store.ClaimRequest{ID: store.ID{Key: "done"}, Fingerprint: fpA, Lease: time.Minute, Retention: time.Hour}
	tok := mustClaim(t, s, done).Token
	if err := s.Complete(ctx, done.ID, tok, store.Response{Status: 201, Body: []byte("paid")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	busy := store.ClaimRequest{ID: store.ID{Key: "busy"}, Fingerprint: fpA, Lease: time.Minute, Retention: time.Hour}
	mustClaim(t, s, busy)
	fillMemory(t, c)
	if r, ok, err := s.Peek(ctx, done.ID, fpA); err != nil || !ok || r.Outcome != store.Completed {
		t.Fatalf("Peek of the record when full: %+v %v %v", r, ok, err)
	}
	var failed []string
	if r, err := s.Claim(ctx, done); err != nil || r.Outcome != store.Completed {
		failed = append(failed, "replay: "+errString(err))
	}
	if r, err := s.Claim(ctx, busy); err != nil || r.Outcome != store.InFlight {
		failed = append(failed, "duplicate: "+errString(err))
	}
	other := done
	other.Fingerprint = store.Fingerprint{9}
	if r, err := s.Claim(ctx, other); err != nil || r.Outcome != store.Mismatch {
		failed = append(failed, "mismatch: "+errString(err))
	}
	fresh := done
	fresh.ID = store.ID{Key: "fresh"}
	if r, err := s.Claim(ctx, fresh); err == nil {
		failed = append(failed, fmt.Sprintf("a new key claimed on a full server: %+v", r))
	}
	if len(failed) > 0 {
		t.Fatalf("a full Redis (noeviction) answers claims that need no write with an error: %v", failed)
	}
}
