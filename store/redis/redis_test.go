package redis_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
)

func TestConformance(t *testing.T) {
	c := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(s.StopWaiters)
		return storetest.Subject{Store: s}
	})
}

// TestConformanceCluster proves the Cluster claim: the whole suite against a real
// three-master Redis Cluster started on free local ports.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	c := redistest.StartCluster(t)
	t.Run("HashSlot", func(t *testing.T) { testHashSlot(t, c) })
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(s.StopWaiters)
		return storetest.Subject{Store: s}
	})
	// The suite's keys really were spread over the masters.
	var used atomic.Int32
	_ = c.ForEachMaster(t.Context(), func(ctx context.Context, n *goredis.Client) error {
		if strings.Contains(n.Info(ctx, "commandstats").Val(), "cmdstat_set:") {
			used.Add(1)
		}
		return nil
	})
	if used.Load() < 2 {
		t.Errorf("claims ran on %d masters, want the keys spread over at least 2", used.Load())
	}
}

// TestConformanceSentinel runs the suite through a Sentinel failover client
// (redis.NewFailoverClient) on a private master and Sentinel.
func TestConformanceSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server and a Sentinel")
	}
	c := redistest.StartSentinel(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(s.StopWaiters)
		return storetest.Subject{Store: s}
	})
}

var (
	fpA = store.Fingerprint{1}
	fpB = store.Fingerprint{2}
)

func claimReq(id store.ID, fp store.Fingerprint) store.ClaimRequest {
	return store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Second, Retention: time.Minute}
}

func TestKeyLayoutInjective(t *testing.T) {
	s := redis.NewForTest(t, unconnected(t), redis.WithPrefix("p:"))
	ids := []store.ID{
		{Scope: "", Key: "ab"}, {Scope: "a", Key: "b"}, {Scope: "ab", Key: ""},
		{Scope: "1:a", Key: "b"}, {Scope: "1", Key: ":ab"}, {Scope: "a}", Key: "{b"},
		{Scope: "a\x00", Key: "b"}, {Scope: "a", Key: "\x00b"}, {Scope: "10", Key: "x"},
	}
	seen := map[string]store.ID{}
	for _, id := range ids {
		k := s.Key(id)
		if prev, ok := seen[k]; ok {
			t.Errorf("%+v and %+v share key %q", prev, id, k)
		}
		seen[k] = id
	}
	if got, want := s.Key(store.ID{Scope: "tenant", Key: "order-42"}), "p:{6:tenantorder-42}"; got != want {
		t.Errorf("Key = %q, want %q (the documented layout)", got, want)
	}
}

func TestCorruptRecord(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	tok := store.NewToken()
	tests := []struct {
		name  string
		setup func(key string)
	}{
		{"string", func(k string) { c.Set(ctx, k, "garbage", time.Minute) }},
		{"list", func(k string) { c.RPush(ctx, k, "x") }},
		{"hash without version", func(k string) { c.HSet(ctx, k, "foo", "bar") }},
		{"future version", func(k string) { c.HSet(ctx, k, "v", "2", "st", "c", "fp", string(fpA[:])) }},
		{"unknown state", func(k string) { c.HSet(ctx, k, "v", "1", "st", "x", "fp", string(fpA[:]), "tok", string(tok[:])) }},
		{"bad lease", func(k string) { c.HSet(ctx, k, "v", "1", "st", "p", "fp", string(fpA[:]), "le", "soon") }},
		{"bad status", func(k string) {
			c.HSet(ctx, k, "v", "1", "st", "c", "fp", string(fpA[:]), "ca", "1", "cd", "2", "ex", "3", "s", "ok")
		}},
		{"bad timestamp", func(k string) {
			c.HSet(ctx, k, "v", "1", "st", "c", "fp", string(fpA[:]), "ca", "x", "cd", "2", "ex", "3", "s", "200")
		}},
		{"bad header", func(k string) {
			c.HSet(ctx, k, "v", "1", "st", "c", "fp", string(fpA[:]), "ca", "1", "cd", "2", "ex", "3", "s", "200", "h", "\x05\xff")
		}},
		{"omitted with body", func(k string) {
			c.HSet(ctx, k, "v", "1", "st", "c", "fp", string(fpA[:]), "ca", "1", "cd", "2", "ex", "3", "s", "200", "b", "x", "o", "1")
		}},
		{"marker of the wrong length", func(k string) { c.Set(ctx, k, "\x02p\x00"+string(fpA[:])+"short", 0) }},
		{"record, bad status", func(k string) { c.Set(ctx, k, record(0, 0, 0, ""), 0) }},
		{"record, headers past the end", func(k string) { c.Set(ctx, k, record(0, 200, 5, "ab"), 0) }},
		{"record, bad headers", func(k string) { c.Set(ctx, k, record(0, 200, 2, "\x05\xff"), 0) }},
		{"record, omitted with body", func(k string) { c.Set(ctx, k, record(1, 200, 0, "x"), 0) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
			id := store.ID{Scope: "s", Key: "k"}
			key := s.Key(id)
			tc.setup(key)
			c.Expire(ctx, key, time.Minute)
			before := c.Dump(ctx, key).Val()
			_, err := s.Claim(ctx, claimReq(id, fpA))
			if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("Claim: %v, want ErrCorrupt", err)
			}
			if _, _, err := s.Peek(ctx, id, fpA); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("Peek: %v, want ErrCorrupt", err)
			}
			if after := c.Dump(ctx, key).Val(); after != before {
				t.Error("a refused claim changed the foreign data")
			}
		})
	}
	// Fenced transitions on foreign data of another type are errors too, never a panic.
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "s", Key: "k"}
	c.Set(ctx, s.Key(id), "garbage", time.Minute)
	if err := s.Complete(ctx, id, tok, store.Response{Status: 200}, time.Minute); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Complete: %v, want ErrCorrupt", err)
	}
	if err := s.Release(ctx, id, tok); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Release: %v, want ErrCorrupt", err)
	}
	if err := s.Renew(ctx, id, tok, time.Second); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Renew: %v, want ErrCorrupt", err)
	}
}

// record returns a value in the record format (format.go) of fpA with the given
// flags, status and header length, followed by rest.
func record(flags byte, status, hlen int, rest string) string {
	b := append([]byte{2, 'c', flags}, fpA[:]...)
	b = append(b, make([]byte, 56)...) // token, nonce, times
	b = append(b, byte(status>>8), byte(status), 0, 0, byte(hlen>>8), byte(hlen))
	return string(b) + rest
}

// TestRecordLayout pins the documented encoding (format.go): one string per key,
// raw fingerprint, token and body bytes, TTLs on the server clock.
func TestRecordLayout(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "tenant", Key: "k"}
	before := time.Now().UnixMilli()
	res, err := s.Claim(ctx, claimReq(id, fpA))
	after := time.Now().UnixMilli()
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	key := s.Key(id)
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 59*time.Second || ttl > time.Minute {
		t.Errorf("in-flight TTL %v, want the retention (1m)", ttl)
	}
	m := c.Get(ctx, key).Val()
	be := func(s string) int64 { return int64(binary.BigEndian.Uint64([]byte(s))) }
	if len(m) != 67 || m[:3] != "\x02p\x00" || m[3:35] != string(fpA[:]) || m[35:51] != string(res.Token[:]) ||
		be(m[51:59]) < before || be(m[51:59]) > after || be(m[59:67]) != 59000 {
		t.Errorf("marker %q", m)
	}
	body := []byte{0, 1, 2, 0xff, 0xfe}
	resp := store.Response{Status: 201, Header: http.Header{"Location": {"/x"}}, Body: body}
	if err := s.Complete(ctx, id, res.Token, resp, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	r := c.Get(ctx, key).Val()
	head := codec.EncodeHeader(resp.Header)
	if len(r) != 97+len(head)+len(body) || r[:3] != "\x02c\x00" || r[3:59] != m[3:59] ||
		r[91:93] != "\x00\xc9" || r[93:97] != "\x00\x00\x00"+string(rune(len(head))) || r[97:97+len(head)] != string(head) ||
		r[97+len(head):] != string(body) {
		t.Errorf("completed record %q", r)
	}
	if created, done, exp := be(r[51:59]), be(r[75:83]), be(r[83:91]); created > done || exp-done != 120000 {
		t.Errorf("record times created %d completed %d expires %d", created, done, exp)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 119*time.Second || ttl > 2*time.Minute {
		t.Errorf("completed TTL %v, want the retention (2m)", ttl)
	}
}

// TestRenewRaisesTTL: renewing past the claim's retention keeps the key alive for
// the new lease.
func TestRenewRaisesTTL(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "tenant", Key: "k"}
	r := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Second, Retention: 2 * time.Second}
	res, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, id, res.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, s.Key(id)).Val(); ttl < 59*time.Second {
		t.Errorf("TTL after a 1m renew is %v: the record would vanish under its holder", ttl)
	}
}

// TestNoScriptFallback: after SCRIPT FLUSH the store still answers (EVAL fallback).
func TestNoScriptFallback(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	s := redis.NewForTest(t, c)
	id := store.ID{Scope: "tenant", Key: "k"}
	held, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || res.Outcome != store.InFlight {
		t.Fatalf("after SCRIPT FLUSH: %+v %v, want in flight", res, err)
	}
	// The completion's own command (EVALSHA, then EVAL on NOSCRIPT).
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`)}
	if err := s.Complete(ctx, id, held.Token, resp, time.Hour); err != nil {
		t.Fatalf("complete after SCRIPT FLUSH: %v", err)
	}
	res, err = s.Claim(ctx, claimReq(id, fpA))
	if err != nil || res.Outcome != store.Completed || res.Record.Status != 201 || string(res.Record.Body) != `{}` {
		t.Fatalf("replay after the completion: %+v %v", res, err)
	}
}

// TestOneRoundTripPerTransition counts commands: each transition, including a
// refused claim that returns the record, is exactly one; an in-flight duplicate
// is two (the claim, then PTTL for Retry-After).
func TestOneRoundTripPerTransition(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	hook := &redistest.CommandCounter{}
	c.AddHook(hook)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, shared)))
	warm := store.ID{Scope: "warm", Key: "k"} // load every script once
	r, _ := s.Claim(ctx, claimReq(warm, fpA))
	_ = s.Renew(ctx, warm, r.Token, time.Second)
	_ = s.Complete(ctx, warm, r.Token, store.Response{Status: 200}, time.Minute)
	_ = s.Release(ctx, warm, r.Token)

	id := store.ID{Scope: "tenant", Key: "k"}
	var tok store.Token
	steps := []struct {
		name string
		do   func() error
	}{
		{"claim", func() error { r, err := s.Claim(ctx, claimReq(id, fpA)); tok = r.Token; return err }},
		{"in flight", func() error { _, err := s.Claim(ctx, claimReq(id, fpA)); return err }},
		{"renew", func() error { return s.Renew(ctx, id, tok, time.Second) }},
		{"complete", func() error {
			return s.Complete(ctx, id, tok, store.Response{Status: 200, Body: []byte("x")}, time.Minute)
		}},
		{"replay", func() error {
			r, err := s.Claim(ctx, claimReq(id, fpA))
			if err == nil && (r.Outcome != store.Completed || string(r.Record.Body) != "x") {
				t.Errorf("replay: %+v", r)
			}
			return err
		}},
		{"release refused", func() error {
			if err := s.Release(ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("release: %v", err)
			}
			return nil
		}},
	}
	for _, st := range steps {
		before := hook.Count()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		want := int64(1)
		if st.name == "in flight" {
			want = 2 // SET NX GET met the marker; PTTL tells the remaining lease
		}
		if n := hook.Count() - before; n != want {
			t.Errorf("%s: %d round trips, want %d", st.name, n, want)
		}
	}
}

func TestCheckEvictionPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy string
		ok     bool
	}{{"noeviction", true}, {"volatile-lru", false}, {"allkeys-lru", false}} {
		srv := redistest.StartServer(t, "--maxmemory-policy", tc.policy)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		err := redis.NewForTest(t, c).CheckEvictionPolicy(t.Context())
		_ = c.Close()
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, redis.ErrEvictionPolicy)) {
			t.Errorf("%s: %v", tc.policy, err)
		}
	}
}

// testHashSlot checks with the server that a key's slot is the slot of its tag.
func testHashSlot(t *testing.T, c *goredis.ClusterClient) {
	s := redis.NewForTest(t, c, redis.WithPrefix("p:"))
	for _, id := range []store.ID{{Scope: "tenant", Key: "order-42"}, {Scope: "a}b", Key: "c"}, {Scope: "", Key: "{x}"}} {
		key := s.Key(id)
		tag := key[strings.IndexByte(key, '{')+1:]
		tag = tag[:strings.IndexByte(tag, '}')]
		got := c.ClusterKeySlot(t.Context(), key).Val()
		want := c.ClusterKeySlot(t.Context(), "{"+tag+"}other").Val()
		if got != want {
			t.Errorf("%q: slot %d, tag %q slot %d", key, got, tag, want)
		}
	}
}

// TestCompletionIsOneGetOneSet counts what Redis itself runs (INFO
// commandstats, on a private server): Complete's script is one GET and one SET
// (the record's times come from the application, bytes 3-58 from the marker),
// and no transition reads the server's clock (TIME, PEXPIRETIME): Renew and
// Wait judge the lease from the key's PTTL.
func TestCompletionIsOneGetOneSet(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	s := redis.NewForTest(t, c)
	t.Cleanup(s.StopWaiters)
	calls := func() map[string]int64 {
		m := map[string]int64{}
		for _, line := range strings.Split(c.Info(ctx, "commandstats").Val(), "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
			if n, _, _ := strings.Cut(rest, ","); ok {
				m[name], _ = strconv.ParseInt(n, 10, 64)
			}
		}
		return m
	}
	id := store.ID{Scope: "tenant", Key: "k"}
	r, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || r.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v %v", r, err)
	}
	if err := s.Renew(ctx, id, r.Token, time.Minute); err != nil { // loads its script
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, id, r.Token, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, r.Token, store.Response{Status: 201, Body: []byte("x")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got := calls()
	if got["time"] != 0 || got["pexpiretime"] != 0 {
		t.Errorf("transitions read the server's clock: %v", got)
	}
	before := got
	id2 := store.ID{Scope: "tenant", Key: "k2"}
	if r, err = s.Claim(ctx, claimReq(id2, fpA)); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id2, r.Token, store.Response{Status: 201, Body: []byte("x")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got = calls()
	for _, name := range []string{"set", "get", "evalsha", "time", "pexpiretime", "eval"} {
		want := map[string]int64{"set": 2, "get": 1, "evalsha": 1}[name]
		if n := got[name] - before[name]; n != want {
			t.Errorf("claim and complete ran %s %d times, want %d (%v)", name, n, want, got)
		}
	}
}
