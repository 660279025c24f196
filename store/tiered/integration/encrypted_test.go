package tiered_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/encrypted"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

// The encrypting wrapper (store/encrypted) over the real servers: the store
// contract holds, and a dump of what each server keeps holds no byte of a
// stored response.

func sealedStore(t testing.TB, st store.Store) *encrypted.Store {
	t.Helper()
	secret := make([]byte, encrypted.KeySize)
	rand.Read(secret)
	e, err := encrypted.New(st, encrypted.Key{ID: "k1", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEncryptedConformancePostgres(t *testing.T) {
	pool := pgPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: sealedStore(t, postgresBackstop(t, pool)), SealsAnew: true}
	})
}

func TestEncryptedConformanceRedis(t *testing.T) {
	c := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		st := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(st.StopWaiters)
		return storetest.Subject{Store: sealedStore(t, st), SealsAnew: true}
	})
}

// TestEncryptedConformanceTiered wraps the tiered store: both tiers keep
// sealed records.
func TestEncryptedConformanceTiered(t *testing.T) {
	c, pool := redistest.Shared(t), pgPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(fast.StopWaiters)
		return storetest.Subject{Store: sealedStore(t, mustTiered(t, fast, postgresBackstop(t, pool), tiered.WithTimeout(testTimeout))), SealsAnew: true}
	})
}

// secretResponses completes n keys on st with random printable bodies (128 B
// to 4 KiB) and header values, and returns what was stored.
func secretResponses(t *testing.T, st store.Store, n int) []store.Response {
	t.Helper()
	rnd := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		for i := range b {
			b[i] = 'a' + b[i]%26
		}
		return b
	}
	var out []store.Response
	for i := range n {
		resp := store.Response{Status: 201, Body: rnd(128 << (i % 6)), Header: http.Header{"X-Card-Token": {string(rnd(32))}}}
		id := store.ID{Scope: "tenant", Key: fmt.Sprint("dump-", i)}
		res, err := st.Claim(t.Context(), store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		if err := st.Complete(t.Context(), id, res.Token, resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		out = append(out, resp)
	}
	return out
}

// leaked returns an 8-byte window of a body or header value found in dump.
func leaked(dump []byte, resps []store.Response) string {
	for _, r := range resps {
		for _, secret := range [][]byte{r.Body, []byte(r.Header.Get("X-Card-Token"))} {
			for i := 0; i+8 <= len(secret); i++ {
				if bytes.Contains(dump, secret[i:i+8]) {
					return string(secret[i : i+8])
				}
			}
		}
	}
	return ""
}

// checkDump fails the test unless the dump of the wrapped store holds no
// 8-byte window of a stored body or header value, and the dump of the same
// store without the wrapper does (the dump sees what the server keeps).
func checkDump(t *testing.T, server string, sealed bool, dump []byte, resps []store.Response) {
	t.Helper()
	switch w := leaked(dump, resps); {
	case sealed && w != "":
		t.Errorf("%s holds %q of a response in clear behind the wrapper", server, w)
	case !sealed && w == "":
		t.Errorf("%s dump without the wrapper shows no response byte: the dump misses what the server keeps", server)
	case len(dump) == 0:
		t.Errorf("%s dump is empty", server)
	}
}

// TestEncryptedDumpPostgres: every column of every row of the records table,
// as Postgres sends it, holds no 8-byte window of a body or header value.
func TestEncryptedDumpPostgres(t *testing.T) {
	pool := pgPool(t)
	for _, sealed := range []bool{true, false} {
		schema := "idemkey_enc_" + store.NewToken().String()[:12]
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop schema %s: %v", schema, err)
			}
		})
		var st store.Store = postgresBackstop(t, pool, postgres.WithSchema(schema))
		if sealed {
			st = sealedStore(t, st)
		}
		resps := secretResponses(t, st, 12)
		rows, err := pool.Query(t.Context(), "SELECT * FROM "+pgx.Identifier{schema, postgres.DefaultTable}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		var dump []byte
		for rows.Next() {
			for _, col := range rows.RawValues() {
				dump = append(dump, col...)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		checkDump(t, "Postgres", sealed, dump, resps)
	}
}

// TestEncryptedDumpRedis: every key under the store's prefix, read by its
// type (GET, HGETALL, ...) and with DUMP, holds no 8-byte window of a body or
// header value.
func TestEncryptedDumpRedis(t *testing.T) {
	c := redistest.Shared(t)
	for _, sealed := range []bool{true, false} {
		prefix := redistest.Prefix(t, c)
		rs := mustRedis(t, c, redis.WithPrefix(prefix))
		t.Cleanup(rs.StopWaiters)
		var st store.Store = rs
		if sealed {
			st = sealedStore(t, rs)
		}
		resps := secretResponses(t, st, 12)
		checkDump(t, "Redis", sealed, redisDump(t, c, prefix), resps)
	}
}

// redisDump reads every key under prefix by its type, and its DUMP.
func redisDump(t *testing.T, c *goredis.Client, prefix string) []byte {
	t.Helper()
	ctx := t.Context()
	keys, err := c.Keys(ctx, prefix+"*").Result() // a private prefix of a few keys
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys under %s: %v %v", prefix, keys, err)
	}
	var dump []byte
	for _, k := range keys {
		d, _ := c.Dump(ctx, k).Result()
		dump = append(dump, d...)
		var vals []string
		switch typ := c.Type(ctx, k).Val(); typ {
		case "string":
			vals = []string{c.Get(ctx, k).Val()}
		case "hash":
			for f, v := range c.HGetAll(ctx, k).Val() {
				vals = append(vals, f, v)
			}
		case "list":
			vals = c.LRange(ctx, k, 0, -1).Val()
		case "set":
			vals = c.SMembers(ctx, k).Val()
		case "zset":
			vals = c.ZRange(ctx, k, 0, -1).Val()
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		for _, v := range vals {
			dump = append(dump, v...)
		}
	}
	return dump
}

// TestEncryptedRecordMovedInPostgres: an operator (or an attacker with write
// access) copies a sealed record's columns onto another key's row with SQL;
// the claim of that key fails with store.ErrCorrupt (503), never replaying
// the other key's answer, and the original still replays.
func TestEncryptedRecordMovedInPostgres(t *testing.T) {
	pool := pgPool(t)
	schema := "idemkey_enc_" + store.NewToken().String()[:12]
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	st := sealedStore(t, postgresBackstop(t, pool, postgres.WithSchema(schema)))
	ctx := t.Context()
	claim := func(key string) (store.ClaimResult, error) {
		return st.Claim(ctx, store.ClaimRequest{ID: store.ID{Scope: "tenant", Key: key}, Fingerprint: fingerprint("same"), Lease: time.Minute, Retention: time.Hour})
	}
	for _, key := range []string{"victim", "other"} {
		res, err := claim(key)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatal(res.Outcome, err)
		}
		body := []byte(`{"answer for":"` + key + `"}`)
		if err := st.Complete(ctx, store.ID{Scope: "tenant", Key: key}, res.Token, store.Response{Status: 201, Body: body}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	table := pgx.Identifier{schema, postgres.DefaultTable}.Sanitize()
	tag, err := pool.Exec(ctx, "UPDATE "+table+" AS t SET status = s.status, headers = s.headers, body = s.body, body_omitted = s.body_omitted FROM "+table+
		" AS s WHERE t.key = 'other'::bytea AND s.key = 'victim'::bytea")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("copy the sealed columns: %v %v", tag, err)
	}
	if res, err := claim("other"); !errors.Is(err, encrypted.ErrTampered) || !errors.Is(err, store.ErrCorrupt) || res.Record != nil {
		t.Errorf("moved record: %+v, %v; want ErrTampered", res, err)
	}
	if res, err := claim("victim"); err != nil || res.Outcome != store.Completed || string(res.Record.Body) != `{"answer for":"victim"}` {
		t.Errorf("the original: %+v, %v", res, err)
	}
}
