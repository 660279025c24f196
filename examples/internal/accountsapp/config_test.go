package accountsapp

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/accounts"
)

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string // substring; "" means success
	}{
		{name: "defaults", env: map[string]string{},
			want: Config{Addr: "127.0.0.1:8080", Lease: 10 * time.Second, Retention: 24 * time.Hour, Projection: "memory"}},
		{name: "everything", env: map[string]string{"ADDR": "127.0.0.1:0", "IDEM_LEASE": "2s", "IDEM_RETENTION": "1h",
			"CELERIANT_ADDR": "127.0.0.1:10000", "PROJECTION": "Postgres", "DATABASE_URL": "postgres://x", "ACCOUNTS_TABLE_PREFIX": "t_"},
			want: Config{Addr: "127.0.0.1:0", Lease: 2 * time.Second, Retention: time.Hour, CeleriantAddr: "127.0.0.1:10000",
				Projection: "postgres", DatabaseURL: "postgres://x", TablePrefix: "t_"}},
		{name: "sim delay", env: map[string]string{"CELERIANT_SIM_DELAY": "1s"},
			want: Config{Addr: "127.0.0.1:8080", Lease: 10 * time.Second, Retention: 24 * time.Hour, Projection: "memory", SimDelay: time.Second}},
		{name: "bad lease", env: map[string]string{"IDEM_LEASE": "10"}, wantErr: "IDEM_LEASE"},
		{name: "zero lease", env: map[string]string{"IDEM_LEASE": "0s"}, wantErr: "IDEM_LEASE"},
		{name: "negative retention", env: map[string]string{"IDEM_RETENTION": "-1h"}, wantErr: "IDEM_RETENTION"},
		{name: "retention below lease", env: map[string]string{"IDEM_LEASE": "1m", "IDEM_RETENTION": "30s"}, wantErr: "at least IDEM_LEASE"},
		{name: "unknown projection", env: map[string]string{"PROJECTION": "mysql"}, wantErr: "PROJECTION"},
		{name: "postgres projection without a database", env: map[string]string{"PROJECTION": "postgres"}, wantErr: "DATABASE_URL"},
		{name: "sim delay with a real Celeriant", env: map[string]string{"CELERIANT_SIM_DELAY": "1s", "CELERIANT_ADDR": "x:1"}, wantErr: "CELERIANT_SIM_DELAY"},
		{name: "negative sim delay", env: map[string]string{"CELERIANT_SIM_DELAY": "-1s"}, wantErr: "non-negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadConfig(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want ErrConfig mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestIndexWindow(t *testing.T) {
	for retention, want := range map[time.Duration]time.Duration{
		24 * time.Hour:  24 * time.Hour,
		2 * time.Second: accounts.DefaultWindow,
		0:               accounts.DefaultWindow,
	} {
		if got := indexWindow(retention); got != want {
			t.Errorf("indexWindow(%v) = %v, want %v", retention, got, want)
		}
	}
}
