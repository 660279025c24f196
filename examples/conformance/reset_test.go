package main

import (
	"net/http"
	"os"
	"testing"

	"github.com/idemkey/idemkey/store"
)

// TestResetForgetsAcrossProcesses: on a persistent store, a restarted fixture and
// a second instance sharing its table must not see keys stored before their own
// POST /reset. With a reset generation counted from 0 in every process, the
// second life's reset lands on the generation the first life used, and a vector
// rerun against the same store is answered from the first run's records.
func TestResetForgetsAcrossProcesses(t *testing.T) {
	if os.Getenv("DATABASE_URL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DATABASE_URL is not set; CI=true requires a Postgres server")
		}
		t.Skip("DATABASE_URL is not set")
	}
	env := storeEnv(t, "postgres")
	key := map[string]string{"Idempotency-Key": "reset-" + store.NewToken().String()}
	post := func(t *testing.T, base, body string, wantStatus int) {
		t.Helper()
		r := send(base, "POST", "/echo", key, []byte(body))
		if r.err != nil || r.status != wantStatus || (wantStatus == http.StatusCreated && string(r.body) != body) {
			t.Fatalf("POST /echo %q: %d %q %v; want %d", body, r.status, r.body, r.err, wantStatus)
		}
	}
	reset := func(t *testing.T, base string) {
		t.Helper()
		if r := send(base, "POST", "/reset", nil, nil); r.err != nil || r.status != http.StatusNoContent {
			t.Fatalf("reset: %d %v", r.status, r.err)
		}
	}

	// Each life is a subtest, so its server stops when the subtest ends.
	t.Run("first life", func(t *testing.T) {
		base := startServer(t, env)
		reset(t, base)
		post(t, base, "first run", http.StatusCreated)
		post(t, base, "other payload", http.StatusUnprocessableEntity) // the key is held
	})
	t.Run("restarted", func(t *testing.T) {
		base := startServer(t, env)
		reset(t, base)
		post(t, base, "second run", http.StatusCreated) // not 422: the first run is forgotten
		if n := counter(t, base); n != 1 {
			t.Fatalf("counter %d, want 1", n)
		}
		// A second instance on the same table, alive at the same time.
		other := startServer(t, env)
		reset(t, other)
		post(t, other, "third run", http.StatusCreated)
		// Without a reset the first instance keeps its own generation's record.
		if r := send(base, "POST", "/echo", key, []byte("second run")); r.status != http.StatusCreated ||
			r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != "second run" {
			t.Fatalf("replay on the first instance: %d %v %q", r.status, r.header, r.body)
		}
	})
}
