package redis_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestPeek covers what Redis alone may answer for store/tiered, and that Peek never
// writes.
func TestPeek(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	tok := store.NewToken()
	rec := &store.Record{
		Fingerprint: fpA,
		Response:    store.Response{Status: 201, Header: http.Header{"Location": {"/x"}}, Body: []byte{0, 1, 2}},
		CreatedAt:   time.UnixMilli(1000), CompletedAt: time.UnixMilli(2000), ExpiresAt: time.UnixMilli(3000),
	}
	tests := []struct {
		name   string
		setup  func(s *redis.Store, id store.ID) error
		fp     store.Fingerprint
		ok     bool
		answer store.Outcome
	}{
		{"absent", func(*redis.Store, store.ID) error { return nil }, fpA, false, 0},
		{"live marker", func(s *redis.Store, id store.ID) error { return s.Mark(ctx, id, fpA, tok, time.Minute) }, fpA, true, store.InFlight},
		{"live marker, other request", func(s *redis.Store, id store.ID) error { return s.Mark(ctx, id, fpA, tok, time.Minute) }, fpB, false, 0},
		{"expired lease", func(s *redis.Store, id store.ID) error {
			_, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Second, Retention: time.Minute})
			if err != nil {
				return err
			}
			return endLease(ctx, c, s.Key(id))
		}, fpA, false, 0},
		{"filled record", func(s *redis.Store, id store.ID) error { return s.Fill(ctx, id, rec, time.Minute) }, fpA, true, store.Completed},
		{"filled record, other request", func(s *redis.Store, id store.ID) error { return s.Fill(ctx, id, rec, time.Minute) }, fpB, true, store.Mismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
			id := store.ID{Scope: "tenant", Key: "k"}
			if err := tc.setup(s, id); err != nil {
				t.Fatal(err)
			}
			before := c.Dump(ctx, s.Key(id)).Val()
			res, ok, err := s.Peek(ctx, id, tc.fp)
			if err != nil || ok != tc.ok || (ok && res.Outcome != tc.answer) {
				t.Fatalf("Peek: %+v ok=%v err=%v; want ok=%v %v", res, ok, err, tc.ok, tc.answer)
			}
			if res.Outcome == store.InFlight && (res.RetryAfter <= 0 || res.RetryAfter > time.Minute) {
				t.Errorf("RetryAfter %v", res.RetryAfter)
			}
			if res.Outcome == store.Completed {
				r := res.Record
				if r.Status != 201 || string(r.Body) != "\x00\x01\x02" || r.Header.Get("Location") != "/x" ||
					!r.CompletedAt.Equal(rec.CompletedAt) || !r.ExpiresAt.Equal(rec.ExpiresAt) || r.Fingerprint != fpA {
					t.Errorf("record %+v, want the filled one", r)
				}
			}
			if after := c.Dump(ctx, s.Key(id)).Val(); after != before {
				t.Error("Peek changed the record")
			}
		})
	}
}

// TestMarkIsFenced: a marker carries the authoritative token; the fenced scripts
// act on it only with that token, and its key expires with the lease.
func TestMarkIsFenced(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "tenant", Key: "k"}
	holder, other := store.NewToken(), store.NewToken()
	if err := s.Mark(ctx, id, fpA, holder, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, s.Key(id)).Val(); ttl <= 0 || ttl > 2*time.Second {
		t.Errorf("marker TTL %v, want the lease (2s)", ttl)
	}
	if err := s.Complete(ctx, id, other, store.Response{Status: 200}, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete with another token: %v", err)
	}
	if err := s.Complete(ctx, id, holder, store.Response{Status: 200, Body: []byte("x")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, ok, err := s.Peek(ctx, id, fpA); err != nil || !ok || string(res.Record.Body) != "x" {
		t.Errorf("after Complete: %+v %v %v", res, ok, err)
	}
	if ttl := c.PTTL(ctx, s.Key(id)).Val(); ttl < 59*time.Second {
		t.Errorf("completed TTL %v, want the retention", ttl)
	}
}

func TestFastPathInvalid(t *testing.T) {
	s := redis.NewForTest(t, unconnected(t))
	ctx := t.Context()
	id := store.ID{Scope: "s", Key: "k"}
	for name, err := range map[string]error{
		"peek empty key":      func() error { _, _, err := s.Peek(ctx, store.ID{}, fpA); return err }(),
		"mark zero token":     s.Mark(ctx, id, fpA, store.Token{}, time.Second),
		"mark no lease":       s.Mark(ctx, id, fpA, store.NewToken(), 0),
		"fill nil":            s.Fill(ctx, id, nil, time.Second),
		"fill bad status":     s.Fill(ctx, id, &store.Record{}, time.Second),
		"complete zero token": s.Complete(ctx, id, store.Token{}, store.Response{Status: 200}, time.Second),
		"renew no lease":      s.Renew(ctx, id, store.NewToken(), 0),
	} {
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}
