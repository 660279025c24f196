package redis

import (
	"context"
	"testing"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
)

// legacyWriter is the store as a fleet in the middle of an upgrade sees it: every
// new key is claimed in the legacy hash format (as the previous release wrote
// it), and every other call is the store's own, which must then read, complete,
// renew, release, wait on, inspect and evict hashes.
type legacyWriter struct{ *Store }

func (l legacyWriter) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	key := keyFor(l.prefix, req.ID)
	n, err := l.client.Exists(ctx, key).Result()
	if err != nil || n == 1 {
		return l.Store.Claim(ctx, req)
	}
	return l.legacyClaim(ctx, key, req, req.ClaimToken())
}

// TestConformanceLegacyRecords runs the whole store suite on records of the
// legacy hash format: keys stored by the previous release keep their meaning
// until their TTL ends them.
func TestConformanceLegacyRecords(t *testing.T) {
	c := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := New(c, WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(s.StopSubscriber)
		return storetest.Subject{Store: legacyWriter{s}}
	})
	// The wrapper really wrote hashes.
	s := New(c, WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "s", Key: "k"}
	if _, err := (legacyWriter{s}).Claim(t.Context(), store.ClaimRequest{ID: id, Lease: storetest.Lease, Retention: storetest.Retention}); err != nil {
		t.Fatal(err)
	}
	if typ := c.Type(t.Context(), s.Key(id)).Val(); typ != "hash" {
		t.Fatalf("legacy claim wrote a %s", typ)
	}
}
