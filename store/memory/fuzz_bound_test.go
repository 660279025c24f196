package memory_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// FuzzBoundAccounting runs a random mix of store and cache calls (claims,
// completions, releases, renewals, takeovers after expiry, markers over records
// and fills) on a few keys, and checks that once every record has expired the
// store counts no bytes: every path that adds or replaces a record gives back
// what it took.
func FuzzBoundAccounting(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{0, 16, 33, 50, 67, 84, 101, 118, 5, 6, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := newFakeClock()
		s := memory.New(memory.WithClock(c.Now), memory.WithShards(2), memory.WithMaxBytes(4096))
		tokens := map[string]store.Token{}
		for _, op := range ops {
			key := fmt.Sprint("k", op>>4&3)
			id := store.ID{Scope: "s", Key: key}
			fp := store.Fingerprint{op >> 6}
			resp := store.Response{Status: 201, Header: http.Header{"X-A": {key}}, Body: []byte(key)}
			switch op & 15 {
			case 0, 1:
				res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Second, Retention: time.Minute})
				if err == nil && res.Outcome == store.Claimed {
					tokens[key] = res.Token
				}
			case 2:
				_ = s.Complete(ctx, id, tokens[key], resp, time.Minute)
			case 3:
				_ = s.Release(ctx, id, tokens[key])
			case 4:
				_ = s.Renew(ctx, id, tokens[key], 2*time.Second)
			case 5:
				tok := store.NewToken()
				if s.Mark(ctx, id, fp, tok, time.Second) == nil {
					tokens[key] = tok
				}
			case 6:
				_ = s.Fill(ctx, id, &store.Record{Fingerprint: fp, Response: store.Response{Status: 200, Header: resp.Header, Body: resp.Body},
					CreatedAt: c.Now(), CompletedAt: c.Now(), ExpiresAt: c.Now().Add(time.Minute)}, time.Minute)
			case 7:
				_, _, _ = s.Peek(ctx, id, fp)
			case 8:
				c.Add(1500 * time.Millisecond) // past a lease
			case 9:
				_ = s.Complete(ctx, id, tokens[key], store.Response{Status: 200}, time.Second)
			}
			if st := s.Stats(); st.Bytes < 0 || st.Records == 0 && st.Bytes != 0 {
				t.Fatalf("after op %d: %+v", op, st)
			}
		}
		c.Add(time.Hour)
		for i := range 4 { // a claim per key sweeps its shard; release it again
			id := store.ID{Scope: "s", Key: fmt.Sprint("k", i)}
			if res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Minute}); err == nil && res.Outcome == store.Claimed {
				_ = s.Release(ctx, id, res.Token)
			}
		}
		if st := s.Stats(); st.Records != 0 || st.Bytes != 0 {
			t.Fatalf("all expired: %+v, want no records and no bytes", st)
		}
	})
}
