package redis_test

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestInspectorForeignData: data under a record key that the store cannot
// describe is ErrCorrupt for Inspect and Evict, and Evict leaves it alone, even
// with EvictAny.
func TestInspectorForeignData(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		setup func(k string)
	}{
		{"string", func(k string) { c.Set(ctx, k, "garbage", 0) }},
		{"record, bad status", func(k string) { c.Set(ctx, k, record(0, 0, 0, ""), 0) }},
		{"record, headers past the end", func(k string) { c.Set(ctx, k, record(0, 200, 5, "ab"), 0) }},
		{"hash without version", func(k string) { c.HSet(ctx, k, "foo", "bar") }},
		{"unknown state", func(k string) { c.HSet(ctx, k, "v", "1", "st", "x", "fp", string(fpA[:]), "ca", "1") }},
		{"short fingerprint", func(k string) { c.HSet(ctx, k, "v", "1", "st", "p", "fp", "abc", "le", "1", "ca", "1") }},
		{"in flight without lease", func(k string) { c.HSet(ctx, k, "v", "1", "st", "p", "fp", string(fpA[:]), "ca", "1") }},
		{"bad status", func(k string) {
			c.HSet(ctx, k, "v", "1", "st", "c", "fp", string(fpA[:]), "ca", "1", "cd", "2", "ex", "3", "s", "ok")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
			id := store.ID{Scope: "s", Key: "k"}
			key := s.Key(id)
			tc.setup(key)
			c.Expire(ctx, key, time.Minute)
			before := c.Dump(ctx, key).Val()
			if _, err := s.Inspect(ctx, id); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("Inspect: %v, want ErrCorrupt", err)
			}
			if _, evicted, err := s.Evict(ctx, id, store.EvictAny); !errors.Is(err, store.ErrCorrupt) || evicted {
				t.Errorf("Evict: evicted %v, %v; want ErrCorrupt", evicted, err)
			}
			if after := c.Dump(ctx, key).Val(); after != before {
				t.Error("Evict changed the foreign data")
			}
		})
	}
}

// TestInspectorRoundTrips: Inspect and Evict are one script call each, and an
// in-flight record's ExpiresAt is its key's TTL.
func TestInspectorRoundTrips(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	hook := &redistest.CommandCounter{}
	c.AddHook(hook)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, shared)))
	warm := store.ID{Scope: "warm", Key: "k"} // load both scripts once
	_, _ = s.Inspect(ctx, warm)
	_, _, _ = s.Evict(ctx, warm, store.EvictAny)

	id := store.ID{Scope: "tenant", Key: "k"}
	if _, err := s.Claim(ctx, claimReq(id, fpA)); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"inspect", func() error {
			info, err := s.Inspect(ctx, id) // the TTL is read through another, uncounted client
			if ttl := shared.PTTL(ctx, s.Key(id)).Val(); err == nil && (info.ExpiresAt.Sub(info.Now) < ttl || info.ExpiresAt.Sub(info.Now) > ttl+100*time.Millisecond) {
				t.Errorf("in-flight ExpiresAt %v after now, key TTL %v", info.ExpiresAt.Sub(info.Now), ttl)
			}
			return err
		}},
		{"refused evict", func() error { _, _, err := s.Evict(ctx, id, store.EvictSettled); return err }},
		{"forced evict", func() error { _, _, err := s.Evict(ctx, id, store.EvictAny); return err }},
		{"evict absent", func() error { _, _, err := s.Evict(ctx, id, store.EvictAny); return err }},
	}
	for _, st := range steps {
		before := hook.Count()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if n := hook.Count() - before; n != 1 {
			t.Errorf("%s: %d round trips, want 1", st.name, n)
		}
	}
}
