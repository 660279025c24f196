package apptest

import (
	"bytes"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// lockedBuffer is a log sink safe for the server's goroutines and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// count returns how many lines hold every one of subs.
func (b *lockedBuffer) count(subs ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(b.b.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// metric returns the value of the series whose line starts with series (name and
// labels exactly as exposed), failing the test when /metrics lacks it.
func metric(t testing.TB, s *Server, series string) float64 {
	t.Helper()
	r := Do(t, "GET", s.URL+"/metrics", "", "", "")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(r.Body)
	if m == nil {
		t.Fatalf("/metrics lacks %s", series)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitReady polls /readyz until it answers ready: each probe pings Redis, and
// go-redis redials a pool whose dials failed on its own schedule.
func waitReady(t testing.TB, s *Server) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := Do(t, "GET", s.URL+"/readyz", "", "", "")
		if r.Status == 200 && strings.TrimSpace(r.Body) == `{"status":"ready","checks":{"celeriant":"ok","store":"ok"}}` {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz never ready: %d %s", r.Status, r.Body)
		}
		time.Sleep(50 * time.Millisecond) // an external process's recovery: polled
	}
}

// waitOutageLogEnd keeps the readiness ping (a cache call) going until every
// outage start logged so far has its end logged, or store.OutageQuiet plus 15 s
// have passed (false): an end is logged only on a success once the cache has gone
// store.OutageQuiet without a failure.
func waitOutageLogEnd(t testing.TB, s *Server, logs *lockedBuffer) bool {
	t.Helper()
	deadline := time.Now().Add(store.OutageQuiet + 15*time.Second)
	for logs.count("level=WARN", "fast path down") > logs.count("level=INFO", "fast path recovered") {
		if time.Now().After(deadline) {
			return false
		}
		waitReady(t, s)
		time.Sleep(250 * time.Millisecond) // the server's log has no signal to wait on
	}
	return true
}

func fallThrough(t testing.TB, s *Server) float64 {
	return metric(t, s, `idemkey_tiered_fall_through_total{reason="error"}`) +
		metric(t, s, `idemkey_tiered_fall_through_total{reason="skipped"}`)
}

// RedisOutage runs the tiered store on a private Redis (never the shared one)
// in front of the shared Postgres, then kills that Redis: writes and replays go
// on through Postgres alone, /metrics shows the fall-through counter rising and
// the degraded gauge at 1, /readyz answers 200 "degraded" naming the store, and
// the outage is logged once however many requests meet it; once Redis is back,
// /readyz is ready again and the recovery is logged once. Needs DATABASE_URL
// (skipped without it, failed under CI=true) and redis-server.
func RedisOutage(t *testing.T, wire accountsapp.Wire) {
	db := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	rdb := redistest.StartServer(t)
	table := "idem_outage_" + RandomSuffix()
	t.Cleanup(func() { DropTables(t, db, table, table) })
	var logs lockedBuffer
	s := StartLogged(t, wire, map[string]string{"IDEM_STORE": "tiered", "DATABASE_URL": db, "IDEM_TABLE": table,
		"REDIS_URL": "redis://" + rdb.Addr + "/0"}, slog.New(slog.NewTextHandler(&logs, nil)))

	path := s.URL + "/api/accounts/" + uuid.NewString() + "/deposit"
	if r := Do(t, "POST", path, "before", "", `{"amountCents":5}`); r.Status != 200 {
		t.Fatalf("deposit with Redis up: %d %s", r.Status, r.Body)
	}
	// A loaded machine can miss the fast path's 50 ms timeout even with Redis up,
	// which is an outage of its own: wait for a successful ping (it ends any), and
	// for the log to end it too (else the kill's outage is, in the log, the same
	// one, with no warning of its own), then count from there. Nothing calls Redis
	// between this and the kill.
	waitReady(t, s)
	if !waitOutageLogEnd(t, s, &logs) {
		t.Fatalf("no recovery line within %v of an outage with Redis up", store.OutageQuiet+15*time.Second)
	}
	if metric(t, s, "idemkey_tiered_degraded") != 0 {
		t.Fatal("degraded with Redis up and answering")
	}
	outages0 := metric(t, s, "idemkey_tiered_outages_total")
	warnings0 := logs.count("level=WARN", "fast path down")
	recoveries0 := logs.count("level=INFO", "fast path recovered")

	rdb.Stop()
	checkRedisDown(t, s, path, &logs, outages0, warnings0)

	rdb.Restart(t)
	waitReady(t, s)
	if metric(t, s, "idemkey_tiered_degraded") != 0 {
		t.Error("still degraded after Redis came back")
	}
	// The end of an outage is logged once the cache has answered for a quiet period
	// (store.OutageQuiet) without a failure, on the first success after it: keep
	// the readiness ping (a cache call) going until then. At least one line: a slow
	// first call after the restart may be an outage of its own.
	deadline := time.Now().Add(store.OutageQuiet + 15*time.Second)
	for logs.count("level=INFO", "fast path recovered")-recoveries0 < 1 && time.Now().Before(deadline) {
		waitReady(t, s)
		time.Sleep(250 * time.Millisecond) // the server's log has no signal to wait on
	}
	if n := logs.count("level=INFO", "fast path recovered") - recoveries0; n < 1 {
		t.Errorf("no recovery line within %v after Redis came back", store.OutageQuiet+15*time.Second)
	}
	if r := Do(t, "POST", path, "after", "", `{"amountCents":1}`); r.Status != 200 {
		t.Errorf("deposit after Redis came back: %d %s", r.Status, r.Body)
	}
}

// checkRedisDown: with the tiered store's Redis stopped, Postgres alone serves
// and replays, the fall-through counter rises, readiness says degraded (200),
// and the outage is one more outage and one warning in the log.
func checkRedisDown(t *testing.T, s *Server, path string, logs *lockedBuffer, outages0 float64, warnings0 int) {
	t.Helper()
	before := fallThrough(t, s)
	for i := range 10 {
		if r := Do(t, "POST", path, "during-"+strconv.Itoa(i), "", `{"amountCents":1}`); r.Status != 200 {
			t.Fatalf("deposit %d with Redis down: %d %s; want Postgres alone to serve it", i, r.Status, r.Body)
		}
	}
	if r := Do(t, "POST", path, "before", "", `{"amountCents":5}`); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay with Redis down: %d %v %s", r.Status, r.Header, r.Body)
	}
	if after := fallThrough(t, s); after <= before {
		t.Errorf("fall-through counter %v -> %v with Redis down; want it rising", before, after)
	}
	if metric(t, s, "idemkey_tiered_degraded") != 1 || metric(t, s, "idemkey_tiered_outages_total") != outages0+1 {
		t.Error("degraded gauge not 1, or not one more outage, with Redis down")
	}
	for range 3 {
		r := Do(t, "GET", s.URL+"/readyz", "", "", "")
		if r.Status != 200 || strings.TrimSpace(r.Body) != `{"status":"degraded","checks":{"celeriant":"ok","store":"degraded"}}` {
			t.Fatalf("readyz with Redis down: %d %s; want 200 degraded", r.Status, r.Body)
		}
	}
	if n := logs.count("level=WARN", "fast path down") - warnings0; n != 1 {
		t.Errorf("%d outage warnings for one outage, want 1", n)
	}
	if n := logs.count("readiness check failed"); n != 0 {
		t.Errorf("a degraded store was logged as a failed check %d times", n)
	}
}
