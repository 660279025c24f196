package redis_test

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestFillNeverReplacesARecord: a backfill carries what the authoritative store
// answered some time ago. When a record reached Redis meanwhile (a newer claim's
// marker, or the completion itself), the backfill must leave it: overwriting a
// newer claim's marker would answer Mismatch to that claim's own retries. Garbage
// under the key is still replaced.
func TestFillNeverReplacesARecord(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	old := &store.Record{
		Fingerprint: fpA,
		Response:    store.Response{Status: 200, Body: []byte("old")},
		CreatedAt:   time.UnixMilli(1000), CompletedAt: time.UnixMilli(2000), ExpiresAt: time.UnixMilli(3000),
	}
	for _, tc := range []struct {
		name  string
		setup func(s *redis.Store, id store.ID)
		fp    store.Fingerprint
		want  store.Outcome // Peek's answer for fp after the Fill
		body  string
	}{
		{"absent", func(*redis.Store, store.ID) {}, fpA, store.Completed, "old"},
		{"newer claim's marker", func(s *redis.Store, id store.ID) {
			if err := s.Mark(ctx, id, fpB, store.NewToken(), time.Minute); err != nil {
				t.Fatal(err)
			}
		}, fpB, store.InFlight, ""},
		{"completed meanwhile", func(s *redis.Store, id store.ID) {
			tok := store.NewToken()
			if err := s.Mark(ctx, id, fpB, tok, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, id, tok, store.Response{Status: 201, Body: []byte("new")}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}, fpB, store.Completed, "new"},
		{"garbage", func(s *redis.Store, id store.ID) { c.Set(ctx, s.Key(id), "garbage", time.Minute) }, fpA, store.Completed, "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
			id := store.ID{Scope: "tenant", Key: "k"}
			tc.setup(s, id)
			if err := s.Fill(ctx, id, old, time.Minute); err != nil {
				t.Fatalf("Fill: %v", err)
			}
			res, ok, err := s.Peek(ctx, id, tc.fp)
			if err != nil || !ok || res.Outcome != tc.want || (res.Record != nil && string(res.Record.Body) != tc.body) {
				t.Fatalf("after Fill: %+v ok=%v err=%v; want %v %q", res, ok, err, tc.want, tc.body)
			}
		})
	}
}
