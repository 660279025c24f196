package setup

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

func TestLoad(t *testing.T) {
	defaults := Env{Addr: "127.0.0.1:8080", Store: "memory", Lease: 10 * time.Second, Retention: 24 * time.Hour, Wait: 5 * time.Second,
		MemoryMaxBytes: 64 << 20, IdemTable: "idemkey_records", RedisPrefix: "idemkey:", Projection: "memory"}
	with := func(f func(*Env)) Env { e := defaults; f(&e); return e }
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Env
		wantErr string // substring; "" means success
	}{
		{name: "defaults", env: map[string]string{}, want: defaults},
		{name: "everything", env: map[string]string{"ADDR": "127.0.0.1:0", "IDEM_STORE": " Tiered ", "IDEM_LEASE": "2s",
			"IDEM_RETENTION": "1h", "CELERIANT_ADDR": "127.0.0.1:10000", "PROJECTION": "Postgres", "DATABASE_URL": "postgres://x",
			"REDIS_URL": "redis://y", "IDEM_TABLE": "t", "IDEM_REDIS_PREFIX": "p:", "ACCOUNTS_TABLE_PREFIX": "t_",
			"IDEM_REPLAY_HEADER": "Idempotency-Replayed"},
			want: Env{Addr: "127.0.0.1:0", Store: "tiered", Lease: 2 * time.Second, Retention: time.Hour, Wait: DefaultWait, MemoryMaxBytes: 64 << 20, CeleriantAddrs: []string{"127.0.0.1:10000"},
				Projection: "postgres", DatabaseURL: "postgres://x", RedisURL: "redis://y", IdemTable: "t", RedisPrefix: "p:",
				TablePrefix: "t_", ReplayHeader: "Idempotency-Replayed"}},
		{name: "sim delay", env: map[string]string{"CELERIANT_SIM_DELAY": "1s"}, want: with(func(e *Env) { e.SimDelay = time.Second })},
		{name: "redis store", env: map[string]string{"IDEM_STORE": "redis", "REDIS_URL": "redis://y"},
			want: with(func(e *Env) { e.Store, e.RedisURL = "redis", "redis://y" })},
		{name: "bad lease", env: map[string]string{"IDEM_LEASE": "10"}, wantErr: "IDEM_LEASE"},
		{name: "zero lease", env: map[string]string{"IDEM_LEASE": "0s"}, wantErr: "IDEM_LEASE"},
		{name: "lease of 1ns", env: map[string]string{"IDEM_LEASE": "1ns"}, wantErr: "IDEM_LEASE=1ns is under the minimum lease 100ms"},
		{name: "lease under 100ms", env: map[string]string{"IDEM_LEASE": "99ms"}, wantErr: "IDEM_LEASE"},
		{name: "negative retention", env: map[string]string{"IDEM_RETENTION": "-1h"}, wantErr: "IDEM_RETENTION"},
		{name: "retention below lease", env: map[string]string{"IDEM_LEASE": "1m", "IDEM_RETENTION": "30s"}, wantErr: "at least IDEM_LEASE"},
		{name: "unknown store", env: map[string]string{"IDEM_STORE": "etcd"}, wantErr: "IDEM_STORE"},
		{name: "postgres store without a database", env: map[string]string{"IDEM_STORE": "postgres"}, wantErr: "IDEM_STORE=postgres needs DATABASE_URL"},
		{name: "tiered store without Redis", env: map[string]string{"IDEM_STORE": "tiered", "DATABASE_URL": "postgres://x"}, wantErr: "IDEM_STORE=tiered needs REDIS_URL"},
		{name: "mysql store", env: map[string]string{"IDEM_STORE": "MySQL", "MYSQL_DSN": "root@tcp(db:3306)/app"},
			want: with(func(e *Env) { e.Store, e.MySQLDSN = "mysql", "root@tcp(db:3306)/app" })},
		{name: "mysql store without a DSN", env: map[string]string{"IDEM_STORE": "mysql"}, wantErr: "IDEM_STORE=mysql needs MYSQL_DSN"},
		{name: "dynamodb store", env: map[string]string{"IDEM_STORE": "dynamodb", "AWS_REGION": "eu-west-1", "DYNAMODB_ENDPOINT": "http://127.0.0.1:8000"},
			want: with(func(e *Env) {
				e.Store, e.AWSRegion, e.DynamoDBEndpoint = "dynamodb", "eu-west-1", "http://127.0.0.1:8000"
			})},
		{name: "dynamodb store without a region", env: map[string]string{"IDEM_STORE": "dynamodb"}, wantErr: "IDEM_STORE=dynamodb needs AWS_REGION or DYNAMODB_ENDPOINT"},
		{name: "redis store without Redis", env: map[string]string{"IDEM_STORE": "redis"}, wantErr: "REDIS_URL"},
		{name: "unknown projection", env: map[string]string{"PROJECTION": "mysql"}, wantErr: "PROJECTION"},
		{name: "postgres projection without a database", env: map[string]string{"PROJECTION": "postgres"}, wantErr: "PROJECTION=postgres needs DATABASE_URL"},
		{name: "sim delay with a real Celeriant", env: map[string]string{"CELERIANT_SIM_DELAY": "1s", "CELERIANT_ADDR": "x:1"}, wantErr: "CELERIANT_SIM_DELAY"},
		{name: "negative sim delay", env: map[string]string{"CELERIANT_SIM_DELAY": "-1s"}, wantErr: "non-negative"},
		{name: "microsecond server", env: map[string]string{"CELERIANT_TIMESTAMP_PRECISION": "us"},
			want: with(func(e *Env) { e.TimestampPrecision = celeriant.Microseconds })},
		{name: "nanosecond server", env: map[string]string{"CELERIANT_TIMESTAMP_PRECISION": " NS "},
			want: with(func(e *Env) { e.TimestampPrecision = celeriant.Nanoseconds })},
		{name: "api key and client id", env: map[string]string{"CELERIANT_API_KEY": " AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE= ",
			"CELERIANT_CLIENT_ID": "6f0e4a52-6a3c-4c1b-9d8e-2f7a1b3c4d5e"},
			want: with(func(e *Env) {
				e.APIKey = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
				e.ClientID = uuid.MustParse("6f0e4a52-6a3c-4c1b-9d8e-2f7a1b3c4d5e")
			})},
		{name: "short api key", env: map[string]string{"CELERIANT_API_KEY": "c2hvcnQ="}, wantErr: "CELERIANT_API_KEY"},
		{name: "nil client id", env: map[string]string{"CELERIANT_CLIENT_ID": "00000000-0000-0000-0000-000000000000"}, wantErr: "CELERIANT_CLIENT_ID"},
		{name: "unknown precision", env: map[string]string{"CELERIANT_TIMESTAMP_PRECISION": "s"}, wantErr: "CELERIANT_TIMESTAMP_PRECISION"},
		{name: "wait", env: map[string]string{"IDEM_WAIT": "2s"}, want: with(func(e *Env) { e.Wait = 2 * time.Second })},
		{name: "no wait", env: map[string]string{"IDEM_WAIT": "0"}, want: with(func(e *Env) { e.Wait = 0 })},
		{name: "negative wait", env: map[string]string{"IDEM_WAIT": "-1s"}, wantErr: "IDEM_WAIT"},
		{name: "memory bound", env: map[string]string{"IDEM_MEMORY_MAX_BYTES": " 1048576 "}, want: with(func(e *Env) { e.MemoryMaxBytes = 1 << 20 })},
		{name: "no memory bound", env: map[string]string{"IDEM_MEMORY_MAX_BYTES": "0"}, want: with(func(e *Env) { e.MemoryMaxBytes = 0 })},
		{name: "memory bound with a unit", env: map[string]string{"IDEM_MEMORY_MAX_BYTES": "64MiB"}, wantErr: "IDEM_MEMORY_MAX_BYTES"},
		{name: "negative memory bound", env: map[string]string{"IDEM_MEMORY_MAX_BYTES": "-1"}, wantErr: "IDEM_MEMORY_MAX_BYTES"},
		{name: "a cluster's nodes", env: map[string]string{"CELERIANT_ADDR": " 127.0.0.1:10000, 127.0.0.1:10010,,127.0.0.1:10020 "},
			want: with(func(e *Env) { e.CeleriantAddrs = []string{"127.0.0.1:10000", "127.0.0.1:10010", "127.0.0.1:10020"} })},
		{name: "identity key missing", env: map[string]string{"CELERIANT_IDENTITY_KEY": "/nonexistent/key.pem"}, wantErr: "CELERIANT_IDENTITY_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want ErrConfig mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestConnect: one pool for everything Postgres, only what the environment
// names, and URLs that do not parse are configuration errors.
func TestConnect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name              string
		env               Env
		wantPool, wantRdb bool
		wantErr           error
	}{
		{"memory", Env{Store: "memory", Projection: "memory"}, false, false, nil},
		{"postgres projection", Env{Store: "memory", Projection: "postgres", DatabaseURL: "postgres://127.0.0.1:1/x"}, true, false, nil},
		{"tiered, Redis not needed up", Env{Store: "tiered", Projection: "postgres", DatabaseURL: "postgres://127.0.0.1:1/x",
			RedisURL: "redis://127.0.0.1:1/0"}, true, true, nil},
		{"bad database URL", Env{Store: "postgres", Projection: "memory", DatabaseURL: "postgres://x:y:z/"}, false, false, ErrConfig},
		{"bad Redis URL", Env{Store: "tiered", Projection: "memory", DatabaseURL: "postgres://127.0.0.1:1/x", RedisURL: "http://x"}, false, false, ErrConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Connect(ctx, tc.env)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || c != nil {
					t.Fatalf("Connect = %v, %v; want %v", c, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if (c.Pool != nil) != tc.wantPool || (c.Redis != nil) != tc.wantRdb {
				t.Errorf("pool %v, redis %v; want %v, %v", c.Pool != nil, c.Redis != nil, tc.wantPool, tc.wantRdb)
			}
			if tc.wantRdb && !c.Redis.Options().ContextTimeoutEnabled {
				t.Error("the Redis client ignores its calls' deadlines")
			}
		})
	}
	// The mysql store opens its own pool, lazily; a DSN that does not parse fails.
	c, err := Connect(ctx, Env{Store: "mysql", Projection: "memory", MySQLDSN: "root@tcp(127.0.0.1:1)/x"})
	if err != nil || c.MySQL == nil || c.Pool != nil || c.Redis != nil {
		t.Fatalf("Connect for the mysql store = %+v, %v; want only a MySQL pool", c, err)
	}
	c.Close()
	if c, err := Connect(ctx, Env{Store: "mysql", Projection: "memory", MySQLDSN: "no slash here"}); !errors.Is(err, ErrConfig) || c != nil {
		t.Fatalf("Connect with a bad MYSQL_DSN = %v, %v; want ErrConfig", c, err)
	}
	// The redis store has no backstop: a Redis that does not answer fails now.
	if _, err := Connect(ctx, Env{Store: "redis", Projection: "memory", RedisURL: "redis://127.0.0.1:1/0"}); err == nil {
		t.Error("Connect succeeded for the redis store with Redis down")
	}
}

// TestCloseOrder: Close runs the OnClose functions last first, once.
func TestCloseOrder(t *testing.T) {
	c, err := Connect(context.Background(), Env{Store: "memory", Projection: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	c.OnClose(func() { order = append(order, 1) })
	c.OnClose(func() { order = append(order, 2) })
	c.Close()
	c.Close()
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Errorf("close order %v, want [2 1]", order)
	}
}

// TestLoadIdentity: CELERIANT_IDENTITY_KEY names an RSA key file (PEM PKCS#8 or
// PKCS#1, or Celeriant's base64 PKCS#8); the service then writes under the client id
// the server derives from it, and a CELERIANT_CLIENT_ID that differs from that id is a
// configuration error (the server would answer every write 10003).
func TestLoadIdentity(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := celeriant.IdentityClientID(&key.PublicKey)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	dir := t.TempDir()
	files := map[string][]byte{
		"pkcs8.pem":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		"pkcs1.pem":   pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"private_key": []byte(base64.StdEncoding.EncodeToString(pkcs8) + "\n"),
	}
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		e, err := Load(func(k string) string { return map[string]string{"CELERIANT_IDENTITY_KEY": path}[k] })
		if err != nil || e.ClientID != id || e.Identity == nil || !e.Identity.Equal(key) {
			t.Errorf("%s: client id %s, %v; want %s", name, e.ClientID, err, id)
		}
		_, err = Load(func(k string) string {
			return map[string]string{"CELERIANT_IDENTITY_KEY": path, "CELERIANT_CLIENT_ID": uuid.NewString()}[k]
		})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), id.String()) {
			t.Errorf("%s with another CELERIANT_CLIENT_ID: %v, want ErrConfig naming %s", name, err, id)
		}
	}
}
