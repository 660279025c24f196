package main

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// TestResetForgetsAcrossProcesses: on a persistent store, a restarted fixture and
// a second instance sharing its table must not see keys stored before their own
// POST /reset. With a reset generation counted from 0 in every process, the
// second life's reset lands on the generation the first life used, and a vector
// rerun against the same store is answered from the first run's records.
func TestResetForgetsAcrossProcesses(t *testing.T) {
	testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
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
		// A second instance on the same table, alive at the same time: its
		// reset forgets the keys for both.
		other := startServer(t, env)
		reset(t, other)
		post(t, other, "third run", http.StatusCreated)
		post(t, base, "third run", http.StatusCreated) // a replay of the other's
		if n := counter(t, base); n != 1 {
			t.Fatalf("counter %d on the first instance, want 1 (no second run)", n)
		}
	})
}

// TestResetKeepsInstancesSharing: two fixtures on one persistent store (every
// kind: postgres, redis, tiered) share its keys before and after POST /reset,
// whichever of them is reset and however often: reset both, send one key to
// each, and only the first runs, the second replays it.
func TestResetKeepsInstancesSharing(t *testing.T) {
	for _, name := range []string{"postgres", "redis", "tiered"} {
		t.Run(name, func(t *testing.T) {
			need := map[string][]string{"postgres": {"DATABASE_URL"}, "redis": {"REDIS_URL"}, "tiered": {"DATABASE_URL", "REDIS_URL"}}
			for _, v := range need[name] {
				testenv.Getenv(t, v, "its server")
			}
			env := storeEnv(t, name)
			a, b := startServer(t, env), startServer(t, env)
			for i, resets := range [][]string{{a, b}, {b, a}, {a}, {b}, {a, a, b}} {
				for _, base := range resets {
					if r := send(base, "POST", "/reset", nil, nil); r.err != nil || r.status != http.StatusNoContent {
						t.Fatalf("reset: %d %v", r.status, r.err)
					}
				}
				key := map[string]string{"Idempotency-Key": "share-" + store.NewToken().String()}
				body := []byte("round " + strconv.Itoa(i))
				first, second := send(a, "POST", "/echo", key, body), send(b, "POST", "/echo", key, body)
				if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("round %d: first instance %d %v, want a first run", i, first.status, first.header)
				}
				if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("round %d (resets %d): second instance %d replayed=%q, want the first's answer replayed",
						i, len(resets), second.status, second.header.Get("Idempotent-Replayed"))
				}
			}
		})
	}
}
