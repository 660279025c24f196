package redis

import (
	"context"
	"flag"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

var pace = flag.Duration("redis.pace", 0, "BenchmarkServerCPU: pause after each request (0: back to back)")

// BenchmarkServerCPU reports what Redis's main thread spends (INFO cpu, user and
// system, network included) per request, for the store's paths and for the
// plain commands they are compared with, one request at a time on one
// connection to a private redis-server, the variants interleaved in batches so
// that the machine's load hits all alike:
//
//	get, getset           a GET of the stored record; that GET and a SET of it
//	replay                Claim of the completed key (one SET NX GET)
//	first                 Claim of a new key and Complete (SET NX GET, EVALSHA)
//	first-emptylua        the claim's SET NX GET, then an empty script's EVALSHA
//	first-luagetset       ... then a script that only GETs the key and SETs the record
//	                      (the least a compare-and-set script does on Redis 7)
//	first-plainset        the claim's SET NX GET, then a plain SET of the record
//	get-get-set           two GETs of a new key and a SET (a peer's first execution)
//
// -redis.pace=200us pauses after each request, as requests arriving apart do,
// so that Redis sleeps between them (its caches go cold; Lua's fixed cost
// grows the most):
//
//	go test -run '^$' -bench ServerCPU -benchtime 3000x ./store/redis/ -args -redis.pace=200us
func BenchmarkServerCPU(b *testing.B) {
	srv := redistest.StartServer(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 1})
	info := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 1})
	b.Cleanup(func() { _, _ = c.Close(), info.Close() })
	ctx := context.Background()
	s := NewForTest(b, c, WithPrefix("cpu:"))
	fp := store.Fingerprint{1, 2, 3}
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	claim := func(id store.ID) store.ClaimRequest {
		return store.ClaimRequest{ID: id, Fingerprint: fp, Lease: 10 * time.Second, Retention: time.Hour}
	}
	done := store.ID{Scope: "tenant-1", Key: "0b6f0d2c-3d4e-4c8a-9d1e-2f3a4b5c6d7e"}
	r, err := s.Claim(ctx, claim(done))
	if err == nil {
		err = s.Complete(ctx, done, r.Token, resp, time.Hour)
	}
	if err != nil {
		b.Fatal(err)
	}
	record := c.Get(ctx, s.Key(done)).Val()
	var seq int
	fresh := func() store.ID { seq++; return store.ID{Scope: "tenant-1", Key: "k" + strconv.Itoa(seq)} }
	marker := make([]byte, markerLen)
	putMarker(marker, fp, store.NewToken(), time.Now().UnixMilli(), 3590000)
	setNXGet := func(key string) error {
		if err := c.SetArgs(ctx, key, marker, goredis.SetArgs{Mode: "NX", TTL: time.Hour, Get: true}).Err(); err != goredis.Nil {
			return err
		}
		return nil
	}
	empty := goredis.NewScript("return 1")
	getSet := goredis.NewScript("redis.call('GET', KEYS[1]) return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])")
	variants := []struct {
		name string
		op   func() error
	}{
		{"get", func() error { return c.Get(ctx, s.Key(done)).Err() }},
		{"getset", func() error {
			if err := c.Get(ctx, s.Key(done)).Err(); err != nil {
				return err
			}
			return c.Set(ctx, s.Key(fresh()), record, time.Hour).Err()
		}},
		{"replay", func() error { _, err := s.Claim(ctx, claim(done)); return err }},
		{"first", func() error {
			id := fresh()
			r, err := s.Claim(ctx, claim(id))
			if err != nil {
				return err
			}
			return s.Complete(ctx, id, r.Token, resp, time.Hour)
		}},
		{"first-emptylua", func() error {
			key := s.Key(fresh())
			if err := setNXGet(key); err != nil {
				return err
			}
			return empty.Run(ctx, c, []string{key}).Err()
		}},
		{"first-luagetset", func() error {
			key := s.Key(fresh())
			if err := setNXGet(key); err != nil {
				return err
			}
			return getSet.Run(ctx, c, []string{key}, record, 3600000).Err()
		}},
		{"first-plainset", func() error {
			key := s.Key(fresh())
			if err := setNXGet(key); err != nil {
				return err
			}
			return c.Set(ctx, key, record, time.Hour).Err()
		}},
		{"get-get-set", func() error {
			key := s.Key(fresh())
			for range 2 {
				if err := c.Get(ctx, key).Err(); err != goredis.Nil {
					return err
				}
			}
			return c.Set(ctx, key, record, time.Hour).Err()
		}},
	}
	for _, v := range variants { // load the scripts
		if err := v.op(); err != nil {
			b.Fatal(v.name, err)
		}
	}
	const batch = 100
	spent := make([]time.Duration, len(variants))
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		n := min(batch, b.N-i)
		for j, v := range variants {
			before, err := mainThreadCPU(ctx, info)
			for range n {
				if err == nil {
					err = v.op()
				}
				if *pace > 0 {
					time.Sleep(*pace)
				}
			}
			after, err2 := mainThreadCPU(ctx, info)
			if err != nil || err2 != nil {
				b.Fatal(v.name, err, err2)
			}
			spent[j] += after - before
		}
	}
	for j, v := range variants {
		b.ReportMetric(float64(spent[j].Nanoseconds())/1e3/float64(b.N), v.name+"-redis-us/op")
	}
}

// mainThreadCPU is Redis's main-thread CPU time so far (INFO cpu, user + system).
func mainThreadCPU(ctx context.Context, c *goredis.Client) (time.Duration, error) {
	s, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var d time.Duration
	for _, line := range strings.Split(s, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			d += time.Duration(f * float64(time.Second))
		}
	}
	return d, nil
}
