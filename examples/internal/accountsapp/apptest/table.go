package apptest

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp"
)

// step is one request of the API table and what must come back.
type step struct {
	name         string
	method, path string
	key, client  string
	body         string
	status       int
	code         string // problem code; "" for a success
	json         string // exact body (trimmed), when set
	replayed     bool
}

// Run drives the API of docs/architecture.md section 6 over HTTP against servers built with
// wire, on every backend of Backends: routes and exact JSON, the middleware's
// decisions (replay, 422 mismatch, 400 missing or invalid key, 413, 409 in flight,
// release of a 503 then a rerun), malformed input (400/422, never 500), the probes
// and the metrics, the router's own 404 and 405 releasing the key, the anonymous
// client ID's own scope; and, from the event log, that each key wrote exactly one event.
func Run(t *testing.T, wire accountsapp.Wire) {
	for name, b := range Backends(t) {
		t.Run(name, func(t *testing.T) {
			t.Cleanup(func() { b.Drop(t) }) // after the server's own cleanup: it stops first
			b.Env["IDEM_WAIT"] = waitBound.String()
			s := Start(t, wire, b.Env)
			t.Run("table", func(t *testing.T) { runTable(t, s) })
			t.Run("in flight: the retry waits, 409 past the bound", func(t *testing.T) { inFlight(t, s) })
			t.Run("celeriant busy is 503, released, rerun", func(t *testing.T) { busy(t, s) })
			t.Run("probes and metrics", func(t *testing.T) { probes(t, s) })
			t.Run("the router's 404 and 405 release the key", func(t *testing.T) { routerAnswers(t, s) })
			t.Run("X-Client-ID anonymous is a scope of its own", func(t *testing.T) { anonymousClientID(t, s) })
		})
	}
	t.Run("graceful shutdown drains", func(t *testing.T) { shutdown(t, wire) })
	t.Run("celeriant down", func(t *testing.T) { celeriantDown(t, wire) })
	t.Run("redis down under tiered", func(t *testing.T) { RedisOutage(t, wire) })
}

func runTable(t *testing.T, s *Server) {
	x, y := uuid.New(), uuid.New()
	for _, st := range tableSteps(x, y) {
		checkStep(t, s, st)
	}
	checkHistory(t, s, x, y)
	checkOneWritePerKey(t, s, x, y)
}

// tableSteps are the table's requests in order, on the fresh accounts x and y:
// later steps expect the balances and versions the earlier ones left.
func tableSteps(x, y uuid.UUID) []step {
	xs, ys := x.String(), y.String()
	alice := accounts.AliceID.String()
	dep := "/api/accounts/" + xs + "/deposit"
	wd := "/api/accounts/" + xs + "/withdraw"
	return []step{
		{name: "list accounts", method: "GET", path: "/api/accounts", status: 200,
			json: `{"accounts":[{"id":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e","name":"Alice"},{"id":"3da2fa7e-cf4d-55a1-ae0e-bad709d0de52","name":"Bob"},{"id":"1e344e71-e1fd-5788-930d-b09cdeec5bed","name":"Charlie"}]}`},
		{name: "seeded balance", method: "GET", path: "/api/accounts/" + alice + "/balance", status: 200, json: `{"balanceCents":50000,"aggregateVersion":1}`},
		{name: "deposit", method: "POST", path: dep, key: "d1", body: `{"amountCents":100}`, status: 200, json: `{"balanceCents":100,"aggregateVersion":1}`},
		{name: "deposit replayed", method: "POST", path: dep, key: "d1", body: `{"amountCents":100}`, status: 200, json: `{"balanceCents":100,"aggregateVersion":1}`, replayed: true},
		{name: "quoted key is the same key", method: "POST", path: dep, key: `"d1"`, body: `{"amountCents":100}`, status: 200, json: `{"balanceCents":100,"aggregateVersion":1}`, replayed: true},
		{name: "same key, other amount", method: "POST", path: dep, key: "d1", body: `{"amountCents":200}`, status: 422, code: "key_reused_with_different_payload"},
		{name: "same key, other route", method: "POST", path: wd, key: "d1", body: `{"amountCents":100}`, status: 422, code: "key_reused_with_different_payload"},
		{name: "same key, other client", method: "POST", path: dep, key: "d1", client: "other", body: `{"amountCents":100}`, status: 200, json: `{"balanceCents":200,"aggregateVersion":2}`},
		{name: "no key", method: "POST", path: dep, body: `{"amountCents":100}`, status: 400, code: "idempotency_key_missing"},
		{name: "invalid key", method: "POST", path: dep, key: `"open`, body: `{"amountCents":100}`, status: 400, code: "idempotency_key_invalid"},
		{name: "key too long", method: "POST", path: dep, key: strings.Repeat("k", 256), body: `{"amountCents":100}`, status: 400, code: "idempotency_key_invalid"},
		{name: "body over the fingerprint limit", method: "POST", path: dep, key: "big", body: `{"amountCents":1,"pad":"` + strings.Repeat("x", 1<<20) + `"}`, status: 413, code: "request_too_large"},
		{name: "malformed JSON", method: "POST", path: dep, key: "m1", body: `{"amountCents":`, status: 400, code: "MALFORMED_REQUEST"},
		{name: "not an object", method: "POST", path: dep, key: "m2", body: `[1]`, status: 400, code: "MALFORMED_REQUEST"},
		{name: "empty body", method: "POST", path: dep, key: "m3", status: 400, code: "MALFORMED_REQUEST"},
		{name: "trailing data", method: "POST", path: dep, key: "m4", body: `{"amountCents":1} {}`, status: 400, code: "MALFORMED_REQUEST"},
		{name: "unknown field", method: "POST", path: dep, key: "m5", body: `{"amountCents":1,"currency":"EUR"}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "wrong type", method: "POST", path: dep, key: "m6", body: `{"amountCents":"100"}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "fraction", method: "POST", path: dep, key: "m7", body: `{"amountCents":1.5}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "amount over int32", method: "POST", path: dep, key: "m8", body: `{"amountCents":2147483648}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "amount far over int64", method: "POST", path: dep, key: "m9", body: `{"amountCents":1e30}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "zero amount", method: "POST", path: dep, key: "m10", body: `{"amountCents":0}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "negative amount", method: "POST", path: dep, key: "m11", body: `{"amountCents":-5}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "missing amount", method: "POST", path: dep, key: "m12", body: `{}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "client id over 255 bytes", method: "POST", path: dep, key: "c1", client: strings.Repeat("c", 256), body: `{"amountCents":100}`, status: 400, code: "MALFORMED_REQUEST"},
		{name: "client id of 255 bytes", method: "POST", path: "/api/accounts/" + uuid.NewString() + "/deposit", key: "c1", client: strings.Repeat("c", 255), body: `{"amountCents":100}`, status: 200, json: `{"balanceCents":100,"aggregateVersion":1}`},
		{name: "non-UUID account", method: "POST", path: "/api/accounts/alice/deposit", key: "m13", body: `{"amountCents":1}`, status: 400, code: "MALFORMED_REQUEST"},
		{name: "insufficient funds", method: "POST", path: wd, key: "w1", body: `{"amountCents":1000}`, status: 422, code: "INSUFFICIENT_FUNDS"},
		{name: "insufficient funds replayed", method: "POST", path: wd, key: "w1", body: `{"amountCents":1000}`, status: 422, code: "INSUFFICIENT_FUNDS", replayed: true},
		{name: "withdraw", method: "POST", path: wd, key: "w2", body: `{"amountCents":50}`, status: 200, json: `{"balanceCents":150,"aggregateVersion":3}`},
		{name: "transfer", method: "POST", path: "/api/transfers", key: "t1", body: `{"fromAccountId":"` + xs + `","toAccountId":"` + ys + `","amountCents":50}`, status: 200,
			json: `{"from":{"balanceCents":100,"aggregateVersion":4},"to":{"balanceCents":50,"aggregateVersion":1}}`},
		{name: "transfer replayed", method: "POST", path: "/api/transfers", key: "t1", body: `{"fromAccountId":"` + xs + `","toAccountId":"` + ys + `","amountCents":50}`, status: 200,
			json: `{"from":{"balanceCents":100,"aggregateVersion":4},"to":{"balanceCents":50,"aggregateVersion":1}}`, replayed: true},
		{name: "transfer to itself", method: "POST", path: "/api/transfers", key: "t2", body: `{"fromAccountId":"` + xs + `","toAccountId":"` + xs + `","amountCents":5}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "transfer from a non-UUID", method: "POST", path: "/api/transfers", key: "t3", body: `{"fromAccountId":"bob","toAccountId":"` + xs + `","amountCents":5}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "transfer with a number id", method: "POST", path: "/api/transfers", key: "t4", body: `{"fromAccountId":7,"toAccountId":"` + xs + `","amountCents":5}`, status: 422, code: "VALIDATION_ERROR"},
		{name: "balance after", method: "GET", path: "/api/accounts/" + ys + "/balance", status: 200, json: `{"balanceCents":50,"aggregateVersion":1}`},
		{name: "balance, GET ignores the key", method: "GET", path: "/api/accounts/" + xs + "/balance", key: "d1", status: 200, json: `{"balanceCents":100,"aggregateVersion":4}`},
		{name: "bad minVersion", method: "GET", path: "/api/accounts/" + xs + "/balance?minVersion=x", status: 400, code: "MALFORMED_REQUEST"},
		{name: "unknown API route", method: "GET", path: "/api/nothing", status: 404, code: "NOT_FOUND"},
		{name: "unknown route", method: "GET", path: "/nothing", status: 404, code: "NOT_FOUND"},
		{name: "wrong method on a probe", method: "POST", path: "/healthz", status: 405, code: "METHOD_NOT_ALLOWED"},
		{name: "healthz", method: "GET", path: "/healthz", status: 200},
	}
}

// checkStep sends st and checks its status, replay header, problem code and body.
func checkStep(t *testing.T, s *Server, st step) {
	r := Do(t, st.method, s.URL+st.path, st.key, st.client, st.body)
	if r.Status != st.status {
		t.Errorf("%s: status %d, want %d: %.300s", st.name, r.Status, st.status, r.Body)
		return
	}
	if got := r.Header.Get("Idempotent-Replayed") == "true"; got != st.replayed {
		t.Errorf("%s: replayed %v, want %v", st.name, got, st.replayed)
	}
	if st.code != "" {
		if code, _ := problemCode(t, r); code != st.code {
			t.Errorf("%s: problem code %q, want %q: %s", st.name, code, st.code, r.Body)
		}
	}
	if st.json != "" {
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", st.name, ct)
		}
		if got := strings.TrimSpace(r.Body); got != st.json {
			t.Errorf("%s: body\n got %s\nwant %s", st.name, got, st.json)
		}
	}
	if st.code == "INSUFFICIENT_FUNDS" && !strings.Contains(r.Body, `"balanceCents":200`) {
		t.Errorf("%s: no balanceCents 200 in %s", st.name, r.Body)
	}
}

// checkHistory checks the events of x the table left: two deposits, a withdraw
// and the transfer to y, and the balance and version they add up to.
func checkHistory(t *testing.T, s *Server, x, y uuid.UUID) {
	xs, ys := x.String(), y.String()
	r := Do(t, "GET", s.URL+"/api/accounts/"+xs+"/history", "", "", "")
	var hist struct {
		Events []struct {
			Type        string `json:"type"`
			AmountCents int32  `json:"amountCents"`
			ToAccountID string `json:"toAccountId"`
		} `json:"events"`
		CurrentAggregateVersion uint64 `json:"currentAggregateVersion"`
		BalanceCents            int64  `json:"balanceCents"`
	}
	if err := json.Unmarshal([]byte(r.Body), &hist); err != nil || r.Status != 200 {
		t.Fatalf("history: %d %s (%v)", r.Status, r.Body, err)
	}
	var types []string
	for _, e := range hist.Events {
		types = append(types, e.Type)
	}
	if strings.Join(types, ",") != "Deposited,Deposited,Withdrawn,TransferredOut" || hist.BalanceCents != 100 ||
		hist.CurrentAggregateVersion != 4 || hist.Events[3].ToAccountID != ys {
		t.Errorf("history %s", r.Body)
	}
}

// checkOneWritePerKey checks, from the event log, that every key wrote once, in
// its own scope, and that refused or invalid requests wrote nothing.
func checkOneWritePerKey(t *testing.T, s *Server, x, y uuid.UUID) {
	for _, c := range []struct {
		acct           uuid.UUID
		scope, key, op string
		want           int
		whatItProves   string
	}{
		{x, "anonymous", "d1", accounts.Operation("deposit", 100, x), 1, "a replayed deposit does not write again"},
		{x, "other", "d1", accounts.Operation("deposit", 100, x), 1, "another client's key is its own"},
		{x, "anonymous", "w1", accounts.Operation("withdraw", 1000, x), 0, "a refused withdraw writes nothing"},
		{x, "anonymous", "t1", accounts.Operation("transfer", 50, x, y), 1, "the transfer's debit leg"},
		{y, "anonymous", "t1", accounts.Operation("transfer", 50, x, y), 1, "the transfer's credit leg"},
		{x, "anonymous", "m8", accounts.Operation("deposit", 2147483647, x), 0, "invalid input writes nothing"},
	} {
		if n := EventCount(t, s.App.Events, c.acct, accounts.EventIDFor(c.scope, c.key, c.op)); n != c.want {
			t.Errorf("%s/%s: %d events in the log, want %d (%s)", c.scope, c.key, n, c.want, c.whatItProves)
		}
	}
}

// waitBound is the servers' IDEM_WAIT: how long a retry racing the original
// waits for its answer.
const waitBound = time.Second

// inFlight holds a deposit inside Celeriant and sends its retry: it waits for
// the original up to IDEM_WAIT, then gets 409 with Retry-After. A retry sent as
// the original completes ends with the original's answer (a replay), and so
// does one after it.
func inFlight(t *testing.T, s *Server) {
	acct := uuid.New()
	path := s.URL + "/api/accounts/" + acct.String() + "/deposit"
	hold := s.Sim.HoldNextWrite()
	first := make(chan Response, 1)
	go func() { first <- Do(t, "POST", path, "slow", "", `{"amountCents":7}`) }()
	<-hold.Prepared()
	t0 := time.Now()
	r := Do(t, "POST", path, "slow", "", `{"amountCents":7}`)
	if code, _ := problemCode(t, r); r.Status != http.StatusConflict || code != "request_in_flight" || r.Header.Get("Retry-After") == "" {
		t.Errorf("retry during the original: %d %v %s", r.Status, r.Header, r.Body)
	}
	if d := time.Since(t0); d < waitBound {
		t.Errorf("409 after %v, before the wait bound %v", d, waitBound)
	}
	racing := make(chan Response, 1)
	go func() { racing <- Do(t, "POST", path, "slow", "", `{"amountCents":7}`) }()
	hold.Commit()
	const want = `{"balanceCents":7,"aggregateVersion":1}`
	if r := <-first; r.Status != 200 || strings.TrimSpace(r.Body) != want {
		t.Errorf("original: %d %s", r.Status, r.Body)
	}
	if r := <-racing; r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" || strings.TrimSpace(r.Body) != want {
		t.Errorf("retry racing the original: %d %v %s, want the original's answer replayed", r.Status, r.Header, r.Body)
	}
	if r := Do(t, "POST", path, "slow", "", `{"amountCents":7}`); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after: %d %v", r.Status, r.Header)
	}
	if n := EventCount(t, s.App.Events, acct, accounts.EventIDFor("anonymous", "slow", accounts.Operation("deposit", 7, acct))); n != 1 {
		t.Errorf("%d events, want 1", n)
	}
}

// busy makes Celeriant answer "server busy": 503 with Retry-After, the claim is
// released, and the retry runs and writes once.
func busy(t *testing.T, s *Server) {
	acct := uuid.New()
	path := s.URL + "/api/accounts/" + acct.String() + "/deposit"
	s.Sim.InjectWriteError(celeriant.CodeServerBusy, "")
	r := Do(t, "POST", path, "busy", "", `{"amountCents":9}`)
	if code, _ := problemCode(t, r); r.Status != 503 || code != "SERVICE_UNAVAILABLE" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("busy: %d %v %s", r.Status, r.Header, r.Body)
	}
	r = Do(t, "POST", path, "busy", "", `{"amountCents":9}`)
	if r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" || strings.TrimSpace(r.Body) != `{"balanceCents":9,"aggregateVersion":1}` {
		t.Fatalf("retry: %d %v %s", r.Status, r.Header, r.Body)
	}
	if n := EventCount(t, s.App.Events, acct, accounts.EventIDFor("anonymous", "busy", accounts.Operation("deposit", 9, acct))); n != 1 {
		t.Errorf("%d events, want 1", n)
	}
}

func probes(t *testing.T, s *Server) {
	r := Do(t, "GET", s.URL+"/healthz", "", "", "")
	if r.Status != 200 || r.Body != "ok\n" {
		t.Errorf("healthz: %d %q", r.Status, r.Body)
	}
	r = Do(t, "GET", s.URL+"/readyz", "", "", "")
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(r.Body), &ready); err != nil || r.Status != 200 || ready.Status != "ready" ||
		ready.Checks["store"] != "ok" || ready.Checks["celeriant"] != "ok" {
		t.Errorf("readyz: %d %s", r.Status, r.Body)
	}
	if s.App.Env.Projection == "postgres" && ready.Checks["projection"] != "ok" {
		t.Errorf("readyz does not check the projection: %s", r.Body)
	}

	// One replay, one 409 and one 422 of our own, then read the counters.
	acct := uuid.New().String()
	path := s.URL + "/api/accounts/" + acct + "/deposit"
	Do(t, "POST", path, "m", "metrics", `{"amountCents":1}`)
	Do(t, "POST", path, "m", "metrics", `{"amountCents":1}`)
	Do(t, "POST", path, "m", "metrics", `{"amountCents":2}`)
	r = Do(t, "GET", s.URL+"/metrics", "", "", "")
	if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics: %d %v", r.Status, r.Header)
	}
	for _, want := range []string{
		`idemkey_decisions_total{decision="executed"} `,
		`idemkey_decisions_total{decision="replayed"} `,
		`idemkey_decisions_total{decision="mismatch"} `,
		`idemkey_decisions_total{decision="released"} `,
		`idemkey_decisions_total{decision="in_flight"} `,
		`idemkey_decisions_total{decision="key_missing"} `,
		`idemkey_decisions_total{decision="store_error"} 0`,
		`idemkey_store_latency_seconds_bucket{decision="executed",le="`,
		`idemkey_store_latency_seconds_count{decision="replayed"} `,
		`idemkey_replays_total `,
		`idemkey_in_flight_total 1`,
		`idemkey_mismatches_total `,
		`idemkey_store_errors_total 0`,
		`idemkey_wait_seconds_count `,
		`idemkey_handler_answers_total{status="200"} `,
		`go_goroutines `,
	} {
		if !strings.Contains(r.Body, "\n"+want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	storeSeries := map[string][]string{
		"postgres": {`idemkey_postgres_claim_retries_total `},
		"tiered": {`idemkey_postgres_claim_retries_total `, `idemkey_tiered_fast_misses_total `,
			// Values vary: a loaded machine can miss the fast path's 50 ms timeout.
			`idemkey_tiered_fast_answers_total `, `idemkey_tiered_fall_through_total{reason="error"} `,
			`idemkey_tiered_degraded `},
	}
	for _, want := range storeSeries[s.App.Env.Store] {
		if !strings.Contains(r.Body, "\n"+want) {
			t.Errorf("%s store: metrics lack %q", s.App.Env.Store, want)
		}
	}
	if s.App.Env.Store != "tiered" && strings.Contains(r.Body, "idemkey_tiered_") {
		t.Errorf("%s store: metrics show tiered series", s.App.Env.Store)
	}
	for _, zero := range []string{`idemkey_replays_total 0`, `idemkey_mismatches_total 0`, `idemkey_decisions_total{decision="executed"} 0`} {
		if strings.Contains(r.Body, "\n"+zero+"\n") {
			t.Errorf("metrics still at %s", zero)
		}
	}
}

// shutdown cancels the server while a deposit is inside Celeriant: the server stops
// accepting, the deposit completes with 200, then Serve returns nil.
func shutdown(t *testing.T, wire accountsapp.Wire) {
	s := Start(t, wire, map[string]string{})
	path := s.URL + "/api/accounts/" + uuid.NewString() + "/deposit"
	hold := s.Sim.HoldNextWrite()
	first := make(chan Response, 1)
	go func() { first <- Do(t, "POST", path, "drain", "", `{"amountCents":3}`) }()
	<-hold.Prepared()
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	// Wait until the listener is closed: new connections are refused.
	for {
		req, _ := http.NewRequest("GET", s.URL+"/healthz", nil)
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			break
		}
		resp.Body.Close()
	}
	select {
	case <-stopped:
		t.Fatal("the server stopped before its in-flight request finished")
	default:
	}
	hold.Commit()
	if r := <-first; r.Status != 200 || strings.TrimSpace(r.Body) != `{"balanceCents":3,"aggregateVersion":1}` {
		t.Errorf("in-flight deposit during shutdown: %d %s", r.Status, r.Body)
	}
	<-stopped
}

// celeriantDown closes the simulator: readiness fails and writes are 503.
func celeriantDown(t *testing.T, wire accountsapp.Wire) {
	s := Start(t, wire, map[string]string{})
	if err := s.Sim.Close(); err != nil && !errors.Is(err, celeriant.ErrClosed) {
		t.Fatal(err)
	}
	r := Do(t, "GET", s.URL+"/readyz", "", "", "")
	if r.Status != 503 || !strings.Contains(r.Body, `"status":"unavailable"`) || !strings.Contains(r.Body, `"celeriant":"unavailable"`) {
		t.Errorf("readyz with Celeriant down: %d %s", r.Status, r.Body)
	}
	if strings.Contains(r.Body, "celeriant:") || strings.Contains(r.Body, "127.0.0.1") {
		t.Errorf("readyz shows the failure's cause to the caller: %s", r.Body)
	}
	r = Do(t, "POST", s.URL+"/api/accounts/"+uuid.NewString()+"/deposit", "down", "", `{"amountCents":1}`)
	if code, _ := problemCode(t, r); r.Status != 503 || code != "SERVICE_UNAVAILABLE" {
		t.Errorf("deposit with Celeriant down: %d %s", r.Status, r.Body)
	}
}
