package postgres

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestWaitsForStandby: only a synchronous standby name list with
// synchronous_commit on, remote_write or remote_apply makes a commit wait for a
// standby; a server in recovery never does.
func TestWaitsForStandby(t *testing.T) {
	for _, names := range []string{"", "*", "FIRST 1 (s1, s2)", "ANY 1 (s1)"} {
		for _, commit := range []string{"on", "remote_write", "remote_apply", "local", "off"} {
			for _, standby := range []bool{false, true} {
				r := Replication{SynchronousCommit: commit, SynchronousStandbyNames: names, Standby: standby}
				want := names != "" && !standby && (commit == "on" || commit == "remote_write" || commit == "remote_apply")
				if got := r.WaitsForStandby(); got != want {
					t.Errorf("%v: WaitsForStandby() = %t, want %t", r, got, want)
				}
			}
		}
	}
}

// TestMigrateReportsReplication: against a server whose commits do not wait for
// a standby (the test server), Migrate logs one warning per Store however often
// it runs, and refuses with ErrNotSynchronous under WithSynchronousStandby,
// before it creates anything.
func TestMigrateReportsReplication(t *testing.T) {
	pool := newPool(t, "")
	var rep Replication
	if err := pool.QueryRow(t.Context(), replicationSQL).Scan(&rep.SynchronousCommit,
		&rep.SynchronousStandbyNames, &rep.Standby, &rep.SyncStandbys); err != nil {
		t.Fatal(err)
	}
	if rep.WaitsForStandby() {
		t.Skipf("the test server's commits wait for a standby (%v)", rep)
	}
	var logs bytes.Buffer
	s, err := New(pool, WithSchema(newStore(t, pool, nil).schema), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "do not wait for a synchronous standby"); n != 1 {
		t.Errorf("two Migrates logged %d warnings, want 1:\n%s", n, logs.String())
	}
	got, err := s.Replication(t.Context())
	if err != nil || got != rep {
		t.Errorf("Replication() = %v, %v; want %v", got, err, rep)
	}

	schema := "idemkey_test_sync_refused"
	strict, err := New(pool, WithSchema(schema), WithSynchronousStandby())
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Migrate(t.Context()); !errors.Is(err, ErrNotSynchronous) {
		t.Fatalf("Migrate with WithSynchronousStandby: %v, want ErrNotSynchronous", err)
	}
	var exists bool
	if err := pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
		t.Errorf("a refused Migrate created schema %s (exists %t, err %v)", pgx.Identifier{schema}.Sanitize(), exists, err)
	}
}
