package redis_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

func attackStore(t *testing.T) (*goredis.Client, *redis.Store) {
	t.Helper()
	c := redistest.Shared(t)
	return c, redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
}

func mustClaim(t *testing.T, s *redis.Store, req store.ClaimRequest) store.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	return res
}

// TestEmptyHeaderName: Complete accepts a response whose headers hold an
// empty name (the middleware's deny list lets it through); its replay must then
// work, not answer store.ErrCorrupt (a 503) for the whole retention.
func TestEmptyHeaderName(t *testing.T) {
	c, s := attackStore(t)
	_ = c
	ctx := t.Context()
	id := store.ID{Key: "empty-name"}
	held := mustClaim(t, s, claimReq(id, fpA))
	resp := store.Response{Status: 200, Header: http.Header{"": {"v"}, "X-A": {"1"}}, Body: []byte("paid")}
	err := s.Complete(ctx, id, held.Token, resp, time.Minute)
	if err != nil {
		return // refused at completion: acceptable
	}
	res, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || res.Outcome != store.Completed || string(res.Record.Body) != "paid" {
		t.Fatalf("a response stored with an empty header name is not replayed: %+v %v", res, err)
	}
}

// TestTakeoverRounds: after each lapse exactly one of two simultaneous
// claimers takes over; every older holder's Complete (even with the response
// the new holder stores), Renew and Release is refused, before and after the
// new holder completes, and the replay is the new holder's.
func TestTakeoverRounds(t *testing.T) {
	c, s := attackStore(t)
	ctx := t.Context()
	for round := range 20 {
		id := store.ID{Scope: "r", Key: string(rune('a' + round))}
		req := claimReq(id, fpA)
		holders := []store.Token{mustClaim(t, s, req).Token}
		for range 3 {
			if err := endLease(ctx, c, s.Key(id)); err != nil {
				t.Fatal(err)
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			res := make([]store.ClaimResult, 2)
			for i := range res {
				wg.Go(func() {
					<-start
					r, err := s.Claim(ctx, req)
					if err != nil {
						t.Error(err)
					}
					res[i] = r
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for _, r := range res {
				switch {
				case r.Outcome == store.Claimed && r.Takeover:
					won++
					holders = append(holders, r.Token)
				case r.Outcome != store.InFlight:
					t.Fatalf("round %d: %+v, want a takeover or InFlight", round, r)
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d takeovers, want 1: %+v", round, won, res)
			}
		}
		last := holders[len(holders)-1]
		resp := store.Response{Status: 201, Body: []byte("new")}
		stale := func(when string) {
			for _, tok := range holders[:len(holders)-1] {
				if err := s.Complete(ctx, id, tok, resp, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
					t.Fatalf("%s: stale Complete with the winner's response: %v", when, err)
				}
				if err := s.Renew(ctx, id, tok, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
					t.Fatalf("%s: stale Renew: %v", when, err)
				}
				if err := s.Release(ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
					t.Fatalf("%s: stale Release: %v", when, err)
				}
			}
		}
		stale("before")
		if err := s.Complete(ctx, id, last, resp, time.Minute); err != nil {
			t.Fatal(err)
		}
		stale("after")
		if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.Completed || string(r.Record.Body) != "new" {
			t.Fatalf("replay %+v %v", r, err)
		}
	}
}

// TestSameTokenOtherResponse: a second Complete of the same token is
// answered nil only for the same status, body and omitted mark, and leaves
// the first record as it is.
func TestSameTokenOtherResponse(t *testing.T) {
	_, s := attackStore(t)
	ctx := t.Context()
	id := store.ID{Key: "again"}
	tok := mustClaim(t, s, claimReq(id, fpA)).Token
	first := store.Response{Status: 200, Header: http.Header{"A": {"1"}}, Body: []byte("body")}
	if err := s.Complete(ctx, id, tok, first, time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]store.Response{
		"status":       {Status: 201, Body: []byte("body")},
		"body":         {Status: 200, Body: []byte("bodY")},
		"longer body":  {Status: 200, Body: []byte("body\x00")},
		"shorter body": {Status: 200, Body: []byte("bod")},
		"no body":      {Status: 200},
		"omitted":      {Status: 200, BodyOmitted: true},
		"status 456":   {Status: 456, Body: []byte("body")},
	} {
		if err := s.Complete(ctx, id, tok, r, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s: %v, want ErrLeaseLost", name, err)
		}
	}
	if err := s.Complete(ctx, id, tok, store.Response{Status: 200, Body: []byte("body")}, time.Hour); err != nil {
		t.Errorf("same status and body: %v", err)
	}
	res, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || res.Outcome != store.Completed || res.Record.Header.Get("A") != "1" || string(res.Record.Body) != "body" {
		t.Fatalf("replay %+v %v, want the first response", res, err)
	}
	// An omitted record answers nil to an omitted completion only.
	id2 := store.ID{Key: "omitted"}
	tok2 := mustClaim(t, s, claimReq(id2, fpA)).Token
	if err := s.Complete(ctx, id2, tok2, store.Response{Status: 200, BodyOmitted: true}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id2, tok2, store.Response{Status: 200}, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("not omitted after omitted: %v", err)
	}
	if err := s.Complete(ctx, id2, tok2, store.Response{Status: 200, BodyOmitted: true}, time.Minute); err != nil {
		t.Errorf("omitted again: %v", err)
	}
}

// setLeaseOffset writes a marker's lease offset (format.go bytes 59-66).
func setLeaseOffset(ctx context.Context, c *goredis.Client, key string, off int64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(off))
	return c.SetRange(ctx, key, 59, string(b[:])).Err()
}

// TestLeaseOffsets: a marker whose lease offset and key TTL disagree
// (the lease ended before now, ends later than the key, is negative or out of
// any range a claim writes) answers consistently and never panics: a lease
// that ended is taken over, a live one is InFlight no longer than the key
// lives, and Renew puts the offset back in range.
func TestLeaseOffsets(t *testing.T) {
	c, s := attackStore(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name     string
		off      func(pttl int64) int64
		takeover bool
	}{
		{"ended long ago", func(p int64) int64 { return p + 3600_000 }, true},
		{"ends now", func(p int64) int64 { return p }, true},
		{"live 20s", func(p int64) int64 { return p - 20_000 }, false},
		{"beyond the key", func(p int64) int64 { return -1 }, false},
		{"min int64", func(p int64) int64 { return math.MinInt64 }, false},
		{"max int64", func(p int64) int64 { return math.MaxInt64 }, true},
		{"past maxTTL", func(p int64) int64 { return 1 << 62 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := store.ID{Key: tc.name}
			req := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Minute, Retention: time.Hour}
			first := mustClaim(t, s, req)
			key := s.Key(id)
			pttl := c.PTTL(ctx, key).Val().Milliseconds()
			if err := setLeaseOffset(ctx, c, key, tc.off(pttl)); err != nil {
				t.Fatal(err)
			}
			peek, ok, perr := s.Peek(ctx, id, fpA)
			res, err := s.Claim(ctx, req)
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			if tc.takeover {
				if res.Outcome != store.Claimed || !res.Takeover {
					t.Fatalf("Claim %+v, want a takeover", res)
				}
				if perr != nil || ok {
					t.Errorf("Peek %+v %v %v, want no answer for an ended lease", peek, ok, perr)
				}
				if err := s.Complete(ctx, id, first.Token, store.Response{Status: 200}, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("stale Complete: %v", err)
				}
				return
			}
			if res.Outcome != store.InFlight || res.RetryAfter <= 0 || res.RetryAfter > time.Hour {
				t.Fatalf("Claim %+v, want InFlight within the key's life", res)
			}
			if perr != nil || !ok || peek.Outcome != store.InFlight || peek.RetryAfter > time.Hour {
				t.Errorf("Peek %+v %v %v", peek, ok, perr)
			}
			if err := s.Renew(ctx, id, first.Token, time.Second); err != nil {
				t.Fatal(err)
			}
			res, err = s.Claim(ctx, req)
			if err != nil || res.Outcome != store.InFlight || res.RetryAfter > time.Second {
				t.Fatalf("after Renew(1s): %+v %v", res, err)
			}
		})
	}
}

// TestSkewedCreatedAt: the created-at a replica with a skewed clock
// writes (far future, before 1970, the extremes) decides nothing: the lease is
// judged from the key's TTL, the takeover keeps the time and the record reports it.
func TestSkewedCreatedAt(t *testing.T) {
	c, s := attackStore(t)
	ctx := t.Context()
	for i, created := range []int64{time.Now().Add(100 * 365 * 24 * time.Hour).UnixMilli(), -1, math.MinInt64, math.MaxInt64} {
		id := store.ID{Key: string(rune('a' + i))}
		req := claimReq(id, fpA)
		mustClaim(t, s, req)
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(created))
		if err := c.SetRange(ctx, s.Key(id), 51, string(b[:])).Err(); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.InFlight {
			t.Fatalf("duplicate: %+v %v", res, err)
		}
		if err := endLease(ctx, c, s.Key(id)); err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(ctx, req)
		if err != nil || !res.Takeover {
			t.Fatalf("takeover: %+v %v", res, err)
		}
		if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200}, time.Minute); err != nil {
			t.Fatal(err)
		}
		res, err = s.Claim(ctx, req)
		if err != nil || res.Outcome != store.Completed || res.Record.CreatedAt.UnixMilli() != created {
			t.Fatalf("replay %+v %v, want created at %d", res, err, created)
		}
	}
}

// TestDurations: the shortest and the longest leases and retentions a
// caller may pass give keys with a TTL, claims that answer, and completions
// that replay.
func TestDurations(t *testing.T) {
	c, s := attackStore(t)
	ctx := t.Context()
	const forever = time.Duration(math.MaxInt64)
	for i, d := range []struct{ lease, ret, renew, keep time.Duration }{
		{time.Nanosecond, time.Nanosecond, time.Nanosecond, time.Nanosecond},
		{time.Nanosecond, forever, forever, forever},
		{forever, forever, time.Nanosecond, forever},
		{time.Second, time.Second, forever, time.Millisecond + 1},
		{forever - 1, forever, forever - 1, forever - 1},
	} {
		id := store.ID{Key: string(rune('a' + i))}
		req := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: d.lease, Retention: d.ret}
		res, err := s.Claim(ctx, req)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("%d: Claim %+v %v", i, res, err)
		}
		if p := c.PTTL(ctx, s.Key(id)).Val(); p < 0 && p != -2*time.Nanosecond {
			t.Fatalf("%d: marker PTTL %v", i, p)
		}
		if dup, err := s.Claim(ctx, req); err != nil || dup.Outcome == store.Completed || dup.Outcome == store.Mismatch ||
			dup.Outcome == store.InFlight && dup.RetryAfter.Milliseconds() > codec.Millis(d.lease) {
			t.Fatalf("%d: duplicate %+v %v", i, dup, err)
		}
		err = s.Renew(ctx, id, res.Token, d.renew)
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("%d: Renew %v", i, err)
		}
		err = s.Complete(ctx, id, res.Token, store.Response{Status: 200, Body: []byte("x")}, d.keep)
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("%d: Complete %v", i, err)
		}
		if err == nil && d.keep > time.Hour {
			if p := c.PTTL(ctx, s.Key(id)).Val(); p < time.Hour {
				t.Fatalf("%d: record PTTL %v", i, p)
			}
			if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.Completed {
				t.Fatalf("%d: replay %+v %v", i, r, err)
			}
		}
		mid := store.ID{Key: "mark" + string(rune('a'+i))}
		if err := s.Mark(ctx, mid, fpA, store.NewToken(), d.lease); err != nil {
			t.Fatalf("%d: Mark %v", i, err)
		}
		fid := store.ID{Key: "fill" + string(rune('a'+i))}
		rec := &store.Record{Fingerprint: fpA, Response: store.Response{Status: 200}, ExpiresAt: time.Now().Add(d.keep)}
		if err := s.Fill(ctx, fid, rec, d.keep); err != nil {
			t.Fatalf("%d: Fill %v", i, err)
		}
	}
}

// TestForeignValues: values of every shape near the format (each length
// up to 130 behind each near-miss prefix, random bytes) and keys of other
// types: no operation panics, claims and peeks never answer Claimed or
// Completed for them, Complete, Release and Renew of a token never change
// them, and each error is ErrCorrupt or ErrLeaseLost.
func TestForeignValues(t *testing.T) {
	c, s := attackStore(t)
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	var values []string
	for _, p := range []string{"", "\x02", "\x02p", "\x02c", "\x01c", "\x03p", "\x02P", "\x02c\x00" + string(fpA[:])} {
		for n := len(p); n <= 130; n++ {
			b := []byte(p)
			for len(b) < n {
				b = append(b, byte(rng.Uint32()))
			}
			values = append(values, string(b))
		}
	}
	id := store.ID{Key: "foreign"}
	key := s.Key(id)
	tok := store.NewToken()
	check := func(what string, err error, ok ...error) {
		t.Helper()
		if err == nil {
			return
		}
		for _, e := range ok {
			if errors.Is(err, e) {
				return
			}
		}
		t.Fatalf("%s: %v", what, err)
	}
	try := func(what string, put func()) {
		t.Helper()
		put()
		before, _ := c.Dump(ctx, key).Result()
		res, err := s.Claim(ctx, claimReq(id, fpA))
		check(what+" Claim", err, store.ErrCorrupt)
		if err == nil && (res.Outcome == store.Claimed || res.Outcome == store.Completed && !bytes.HasPrefix([]byte(what), []byte("\x02c"))) {
			t.Fatalf("%q Claim: %+v", what, res)
		}
		_, _, err = s.Peek(ctx, id, fpA)
		check(what+" Peek", err, store.ErrCorrupt)
		check(what+" Complete", s.Complete(ctx, id, tok, store.Response{Status: 200}, time.Minute), store.ErrCorrupt, store.ErrLeaseLost)
		check(what+" Renew", s.Renew(ctx, id, tok, time.Minute), store.ErrCorrupt, store.ErrLeaseLost)
		check(what+" Release", s.Release(ctx, id, tok), store.ErrCorrupt, store.ErrLeaseLost)
		_, err = s.Inspect(ctx, id)
		check(what+" Inspect", err, store.ErrCorrupt)
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err = s.Wait(wctx, id)
		cancel()
		check(what+" Wait", err, store.ErrCorrupt, context.DeadlineExceeded)
		after, _ := c.Dump(ctx, key).Result()
		if after != before && !bytes.HasPrefix([]byte(what), []byte("\x02p")) { // Wait flags a marker-shaped value
			t.Fatalf("%q changed under the store's calls", what)
		}
		c.Del(ctx, key)
	}
	for _, v := range values {
		try(v, func() { c.Set(ctx, key, v, time.Minute) })
	}
	try("list", func() { c.RPush(ctx, key, "x") })
	try("set", func() { c.SAdd(ctx, key, "x") })
	try("zset", func() { c.ZAdd(ctx, key, goredis.Z{Member: "x"}) })
	try("hash without v", func() { c.HSet(ctx, key, "st", "c") })
	try("hash v=2", func() { c.HSet(ctx, key, "v", "2") })
	try("stream", func() { c.XAdd(ctx, &goredis.XAddArgs{Stream: key, Values: []string{"a", "b"}}) })
}

// FuzzCompleteReplay (against REDIS_URL): whatever bytes a response's header
// names, values and body hold, the completion script stores them and the
// replay returns them as sent; the same completion again answers nil and one
// with another body ErrLeaseLost.
func FuzzCompleteReplay(f *testing.F) {
	f.Add(200, "Content-Type", "\x02c\x00\r\n", []byte("\x02p\x00"), false)
	f.Add(999, "\x00", "", []byte{}, true)
	f.Add(100, "X", string(make([]byte, 300)), bytes.Repeat([]byte{0xff}, 97), false)
	c := redistest.Shared(f)
	s := redis.NewForTest(f, c, redis.WithPrefix(redistest.Prefix(f, c)))
	f.Fuzz(func(t *testing.T, status int, name, value string, body []byte, omitted bool) {
		status = 100 + int(uint(status)%900) // every input reaches Redis
		if omitted {
			body = nil
		}
		resp := store.Response{Status: status, Body: body, BodyOmitted: omitted}
		if name != "" { // empty names: TestEmptyHeaderName
			resp.Header = http.Header{name: {value, ""}}
		}
		if store.ValidateResponse(resp, time.Minute) != nil {
			return
		}
		ctx := context.Background()
		id := store.ID{Scope: name[:min(len(name), store.MaxScopeLen)], Key: store.NewToken().String()}
		req := store.ClaimRequest{ID: id, Fingerprint: store.Fingerprint{byte(len(body))}, Lease: time.Minute, Retention: time.Minute}
		held, err := s.Claim(ctx, req)
		if err != nil || held.Outcome != store.Claimed {
			t.Fatalf("Claim %+v %v", held, err)
		}
		defer c.Del(ctx, s.Key(id))
		if err := s.Complete(ctx, id, held.Token, resp, time.Minute); err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(ctx, req)
		if err != nil || res.Outcome != store.Completed || res.Record.Status != status || res.Record.BodyOmitted != omitted ||
			!bytes.Equal(res.Record.Body, body) || len(resp.Header) != len(res.Record.Header) ||
			name != "" && (len(res.Record.Header[name]) != 2 || res.Record.Header[name][0] != value) {
			t.Fatalf("replay %+v %v of %+v", res.Record, err, resp)
		}
		if err := s.Complete(ctx, id, held.Token, resp, time.Minute); err != nil {
			t.Fatalf("same completion again: %v", err)
		}
		other := resp
		other.Body, other.BodyOmitted = append(bytes.Clone(body), 0), false
		if err := s.Complete(ctx, id, held.Token, other, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("completion with another body: %v", err)
		}
	})
}
