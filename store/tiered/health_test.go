package tiered_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

var errDown = errors.New("dial tcp 127.0.0.1:6379: connection refused")

// fakeCache is a cache that answers nothing and, while down is set, fails every
// call the way a stopped Redis does.
type fakeCache struct {
	down  atomic.Bool
	pings atomic.Int64
}

func (c *fakeCache) err() error {
	if c.down.Load() {
		return errDown
	}
	return nil
}

func (c *fakeCache) Peek(context.Context, store.ID, store.Fingerprint) (store.ClaimResult, bool, error) {
	return store.ClaimResult{}, false, c.err()
}
func (c *fakeCache) Mark(context.Context, store.ID, store.Fingerprint, store.Token, time.Duration) error {
	return c.err()
}
func (c *fakeCache) Fill(context.Context, store.ID, *store.Record, time.Duration) error {
	return c.err()
}
func (c *fakeCache) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	return c.err()
}
func (c *fakeCache) Release(context.Context, store.ID, store.Token) error { return c.err() }
func (c *fakeCache) Renew(context.Context, store.ID, store.Token, time.Duration) error {
	return c.err()
}

// pingingCache adds store.Pinger to fakeCache.
type pingingCache struct{ fakeCache }

func (c *pingingCache) Ping(context.Context) error { c.pings.Add(1); return c.err() }

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.FieldsFunc(b.b.String(), func(r rune) bool { return r == '\n' })
}

func claim(t *testing.T, s *tiered.Store, key string) {
	t.Helper()
	res, err := s.Claim(context.Background(), store.ClaimRequest{
		ID: store.ID{Scope: "s", Key: key}, Lease: time.Minute, Retention: time.Hour,
	})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim %s: %+v %v", key, res, err)
	}
}

// newTiered builds a tiered store or fails the test.
func newTiered(t testing.TB, fast tiered.Cache, back store.Store, opts ...tiered.Option) *tiered.Store {
	t.Helper()
	s, err := tiered.New(fast, back, opts...)
	if err != nil {
		t.Fatalf("tiered.New: %v", err)
	}
	return s
}

// TestOutageLoggedOnce: however many claims meet a Redis outage, concurrently and
// with no cooldown to spare Redis the calls, the store logs one warning when it
// starts and one info line when a Redis call succeeds store.OutageQuiet after
// the last error, counts one outage, and every claim is still answered by the
// backstop.
func TestOutageLoggedOnce(t *testing.T) {
	var logs syncBuffer
	cache := &fakeCache{}
	clock := testclock.New(time.Unix(1_700_000_000, 0))
	s := newTiered(t, cache, memory.New(), tiered.WithCooldown(0),
		tiered.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	tiered.SetClock(s, clock.Now)

	claim(t, s, "before")
	cache.down.Store(true)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { claim(t, s, "during-"+string(rune('a'+i%26))+string(rune('a'+i/26))) })
	}
	wg.Wait()
	if st := s.Stats(); !st.Degraded || st.Outages != 1 || st.FastErrors < 50 {
		t.Errorf("during the outage: %+v, want degraded, 1 outage, >= 50 fast errors", st)
	}
	cache.down.Store(false)
	claim(t, s, "after-1")
	if n := len(logs.lines()); n != 1 {
		t.Errorf("%d lines at the first success after the errors, want the start only (the end waits for the quiet period)", n)
	}
	clock.Add(store.OutageQuiet)
	claim(t, s, "after-2")
	if st := s.Stats(); st.Degraded || st.Outages != 1 {
		t.Errorf("after the outage: %+v, want not degraded, 1 outage", st)
	}
	lines := logs.lines()
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "fast path down") ||
		!strings.Contains(lines[0], "connection refused") ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "recovered") {
		t.Errorf("log lines:\n%s\nwant one warning with the error, then one recovery line", strings.Join(lines, "\n"))
	}

	// A second outage is a second pair of lines.
	cache.down.Store(true)
	claim(t, s, "second")
	cache.down.Store(false)
	clock.Add(store.OutageQuiet)
	claim(t, s, "second-after")
	if n := len(logs.lines()); n != 4 || s.Stats().Outages != 2 {
		t.Errorf("after a second outage: %d lines, %d outages; want 4 and 2", n, s.Stats().Outages)
	}
}

// TestFlappingCacheIsOneOutage: a cache that fails every other call is one
// outage in the log, as the middleware's store outage is (store.OutageLog): its
// start once, and its end only after the cache has answered for
// store.OutageQuiet without an error, with the errors counted and the whole
// outage's length.
func TestFlappingCacheIsOneOutage(t *testing.T) {
	var logs syncBuffer
	cache := &fakeCache{}
	clock := testclock.New(time.Unix(1_700_000_000, 0))
	s := newTiered(t, cache, memory.New(), tiered.WithCooldown(0),
		tiered.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	tiered.SetClock(s, clock.Now)
	for i := range 20 {
		cache.down.Store(i%2 == 0)
		claim(t, s, fmt.Sprint("flap-", i))
		clock.Add(100 * time.Millisecond)
	}
	if lines := logs.lines(); len(lines) != 1 || !strings.Contains(lines[0], "fast path down") {
		t.Fatalf("log of a flapping cache:\n%s\nwant the start only", strings.Join(lines, "\n"))
	}
	clock.Add(store.OutageQuiet)
	claim(t, s, "back")
	lines := logs.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "recovered") || !strings.Contains(lines[1], "outage=7s") {
		t.Fatalf("log after a quiet period:\n%s\nwant the start, then the end with the outage's length (7 s)", strings.Join(lines, "\n"))
	}
}

// failingBackstop is a backstop whose Ping fails.
type failingBackstop struct{ *memory.Store }

func (failingBackstop) Ping(context.Context) error { return errors.New("postgres down") }

// TestPing: the backstop decides readiness; the cache only degrades it.
func TestPing(t *testing.T) {
	quiet := tiered.WithLogger(slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name         string
		cache        func() tiered.Cache
		backstop     store.Store
		wantErr      bool
		wantDegraded bool
	}{
		{"all up", func() tiered.Cache { return &pingingCache{} }, memory.New(), false, false},
		{"cache down", func() tiered.Cache { c := &pingingCache{}; c.down.Store(true); return c }, memory.New(), true, true},
		{"backstop down", func() tiered.Cache { return &pingingCache{} }, failingBackstop{memory.New()}, true, false},
		{"both down", func() tiered.Cache { c := &pingingCache{}; c.down.Store(true); return c }, failingBackstop{memory.New()}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTiered(t, tc.cache(), tc.backstop, quiet)
			err := s.Ping(context.Background())
			if (err != nil) != tc.wantErr || errors.Is(err, store.ErrDegraded) != tc.wantDegraded {
				t.Fatalf("Ping = %v; want error %v, degraded %v", err, tc.wantErr, tc.wantDegraded)
			}
			if tc.wantDegraded && (!s.Stats().Degraded || s.Stats().Outages != 1) {
				t.Errorf("a failed cache ping left %+v; want the outage recorded", s.Stats())
			}
		})
	}
}

// TestPingEndsOutage: a probe sees Redis back (and ends the outage) without any
// claim, and a cache without Ping reports the state its last call left.
func TestPingEndsOutage(t *testing.T) {
	quiet := tiered.WithLogger(slog.New(slog.DiscardHandler))
	pc := &pingingCache{}
	s := newTiered(t, pc, memory.New(), quiet)
	pc.down.Store(true)
	claim(t, s, "k")
	pc.down.Store(false)
	if err := s.Ping(context.Background()); err != nil || s.Stats().Degraded {
		t.Errorf("Ping with Redis back = %v, %+v; want nil and not degraded", err, s.Stats())
	}
	if pc.pings.Load() != 1 {
		t.Errorf("%d cache pings, want 1 (Ping is not skipped while cooling down)", pc.pings.Load())
	}

	fc := &fakeCache{}
	s = newTiered(t, fc, memory.New(), quiet)
	fc.down.Store(true)
	claim(t, s, "k")
	if err := s.Ping(context.Background()); !errors.Is(err, store.ErrDegraded) {
		t.Errorf("Ping after a failed Redis call, cache without Ping = %v; want ErrDegraded", err)
	}
}

// slowCache is a live cache whose Ping needs more time than the fast path's
// timeout grants, and hangs until ctx is done when hung is set.
type slowCache struct {
	fakeCache
	hung bool
}

func (c *slowCache) Ping(ctx context.Context) error {
	if c.hung {
		<-ctx.Done()
		return ctx.Err()
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < time.Second {
		return context.DeadlineExceeded // it would not have answered in time
	}
	return nil
}

// liveBackstop is a backstop whose Ping answers nil at once, deadline or not.
type liveBackstop struct{ *memory.Store }

func (liveBackstop) Ping(context.Context) error { return nil }

// TestPingDeadlines: Ping gives the cache the caller's deadline, not the fast
// path's timeout; a hung cache is degraded once that deadline passes; the caller's
// own cancellation is neither degraded nor an outage.
func TestPingDeadlines(t *testing.T) {
	quiet := tiered.WithLogger(slog.New(slog.DiscardHandler))
	s := newTiered(t, &slowCache{}, memory.New(), quiet) // fast-path timeout: 50 ms
	if err := s.Ping(context.Background()); err != nil {
		t.Errorf("Ping of a slow but live cache = %v, want nil", err)
	}

	s = newTiered(t, &slowCache{hung: true}, memory.New(), quiet)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Ping(ctx); err == nil || errors.Is(err, store.ErrDegraded) || s.Stats().Outages != 0 {
		t.Errorf("Ping with a cancelled context = %v, %+v; want the cancellation, no outage", err, s.Stats())
	}

	// The backstop answers whatever the deadline (as a live one does in time), so the
	// hung cache alone meets the 1 ms deadline, however loaded the machine is.
	s = newTiered(t, &slowCache{hung: true}, liveBackstop{memory.New()}, quiet)
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrDegraded) || s.Stats().Outages != 1 {
		t.Errorf("Ping of a hung cache = %v, %+v; want degraded and an outage", err, s.Stats())
	}
}
