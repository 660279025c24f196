package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
)

// fakeService records the last call and answers with err or fixed results.
type fakeService struct {
	err     error
	calls   int
	op      string
	acct    uuid.UUID
	to      uuid.UUID
	amount  int32
	eventID uuid.UUID
	version uint64
	landed  bool // the context carried accounts.MayHaveLanded
}

func (f *fakeService) Accounts() []accounts.Account { return accounts.SeededAccounts() }

func (f *fakeService) Balance(_ context.Context, acct uuid.UUID, minVersion uint64) (accounts.Result, error) {
	f.calls, f.op, f.acct, f.version = f.calls+1, "balance", acct, minVersion
	return accounts.Result{BalanceCents: 7, AggregateVersion: 3}, f.err
}

func (f *fakeService) History(_ context.Context, acct uuid.UUID, from uint64) (accounts.History, error) {
	f.calls, f.op, f.acct, f.version = f.calls+1, "history", acct, from
	to := accounts.BobID
	return accounts.History{
		Events: []accounts.HistoryEvent{
			{AggregateVersion: 1, Timestamp: 1700000000000, Type: accounts.Deposited, AmountCents: 10},
			{AggregateVersion: 2, Timestamp: 1700000000001, Type: accounts.TransferredOut, AmountCents: 3, ToAccountID: &to},
		},
		CurrentAggregateVersion: 2, BalanceCents: 7,
	}, f.err
}

func (f *fakeService) Deposit(ctx context.Context, acct uuid.UUID, amount int32, eventID uuid.UUID) (accounts.Result, error) {
	f.landed = accounts.MarkedMayHaveLanded(ctx)
	f.calls, f.op, f.acct, f.amount, f.eventID = f.calls+1, "deposit", acct, amount, eventID
	return accounts.Result{BalanceCents: 100, AggregateVersion: 1}, f.err
}

func (f *fakeService) Withdraw(ctx context.Context, acct uuid.UUID, amount int32, eventID uuid.UUID) (accounts.Result, error) {
	f.landed = accounts.MarkedMayHaveLanded(ctx)
	f.calls, f.op, f.acct, f.amount, f.eventID = f.calls+1, "withdraw", acct, amount, eventID
	return accounts.Result{BalanceCents: 50, AggregateVersion: 2}, f.err
}

func (f *fakeService) Transfer(ctx context.Context, from, to uuid.UUID, amount int32, eventID uuid.UUID) (accounts.TransferResult, error) {
	f.landed = accounts.MarkedMayHaveLanded(ctx)
	f.calls, f.op, f.acct, f.to, f.amount, f.eventID = f.calls+1, "transfer", from, to, amount, eventID
	return accounts.TransferResult{From: accounts.Result{BalanceCents: 1, AggregateVersion: 2}, To: accounts.Result{BalanceCents: 3, AggregateVersion: 4}}, f.err
}

var quiet = WithLogger(slog.New(slog.DiscardHandler))

func do(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestRoutes drives every route's success path and checks the exact JSON.
func TestRoutes(t *testing.T) {
	alice := accounts.AliceID.String()
	bob := accounts.BobID.String()
	for _, tc := range []struct {
		method, path, body string
		wantOp             string
		wantJSON           string
	}{
		{"GET", "/api/accounts", "", "", `{"accounts":[{"id":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e","name":"Alice"},{"id":"3da2fa7e-cf4d-55a1-ae0e-bad709d0de52","name":"Bob"},{"id":"1e344e71-e1fd-5788-930d-b09cdeec5bed","name":"Charlie"}]}`},
		{"GET", "/api/accounts/" + alice + "/balance", "", "balance", `{"balanceCents":7,"aggregateVersion":3}`},
		{"GET", "/api/accounts/" + alice + "/balance?minVersion=5", "", "balance", `{"balanceCents":7,"aggregateVersion":3}`},
		{"GET", "/api/accounts/" + alice + "/history?fromVersion=1", "", "history", `{"events":[{"aggregateVersion":1,"timestamp":1700000000000,"type":"Deposited","amountCents":10},{"aggregateVersion":2,"timestamp":1700000000001,"type":"TransferredOut","amountCents":3,"toAccountId":"3da2fa7e-cf4d-55a1-ae0e-bad709d0de52"}],"currentAggregateVersion":2,"balanceCents":7}`},
		{"POST", "/api/accounts/" + alice + "/deposit", `{"amountCents":100}`, "deposit", `{"balanceCents":100,"aggregateVersion":1}`},
		{"POST", "/api/accounts/" + alice + "/withdraw", ` {"amountCents": 25}` + "\n", "withdraw", `{"balanceCents":50,"aggregateVersion":2}`},
		{"POST", "/api/transfers", `{"fromAccountId":"` + alice + `","toAccountId":"` + bob + `","amountCents":3}`, "transfer", `{"from":{"balanceCents":1,"aggregateVersion":2},"to":{"balanceCents":3,"aggregateVersion":4}}`},
		{"POST", "/api/accounts/" + strings.ToUpper(alice) + "/deposit", `{"amountCents":2147483647}`, "deposit", `{"balanceCents":100,"aggregateVersion":1}`},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			f := &fakeService{}
			w := do(New(f, quiet), tc.method, tc.path, tc.body)
			if w.Code != 200 {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := strings.TrimSpace(w.Body.String()); got != tc.wantJSON {
				t.Errorf("body\n got %s\nwant %s", got, tc.wantJSON)
			}
			if f.op != tc.wantOp {
				t.Errorf("service op %q, want %q", f.op, tc.wantOp)
			}
			if tc.wantOp != "" && f.acct != accounts.AliceID {
				t.Errorf("account %s", f.acct)
			}
			if strings.Contains(tc.path, "minVersion=5") && f.version != 5 {
				t.Errorf("minVersion %d", f.version)
			}
		})
	}
}

// TestBadInput: every class of bad input is a 400 or 422 problem, and the service is
// never called.
func TestBadInput(t *testing.T) {
	alice := accounts.AliceID.String()
	dep := "/api/accounts/" + alice + "/deposit"
	tr := func(body string) (string, string, string) { return "POST", "/api/transfers", body }
	type tcase struct {
		name, method, path, body string
		status                   int
		code                     string
	}
	cases := []tcase{
		{"syntax error", "POST", dep, `{"amountCents":`, 400, "MALFORMED_REQUEST"},
		{"not json", "POST", dep, `amountCents=5`, 400, "MALFORMED_REQUEST"},
		{"empty body", "POST", dep, ``, 400, "MALFORMED_REQUEST"},
		{"two objects", "POST", dep, `{"amountCents":5}{"amountCents":5}`, 400, "MALFORMED_REQUEST"},
		{"trailing garbage", "POST", dep, `{"amountCents":5} x`, 400, "MALFORMED_REQUEST"},
		{"array", "POST", dep, `[1]`, 400, "MALFORMED_REQUEST"},
		{"unknown field", "POST", dep, `{"amountCents":5,"memo":"x"}`, 422, "VALIDATION_ERROR"},
		{"string amount", "POST", dep, `{"amountCents":"5"}`, 422, "VALIDATION_ERROR"},
		{"float amount", "POST", dep, `{"amountCents":5.5}`, 422, "VALIDATION_ERROR"},
		{"bool amount", "POST", dep, `{"amountCents":true}`, 422, "VALIDATION_ERROR"},
		{"missing amount", "POST", dep, `{}`, 422, "VALIDATION_ERROR"},
		{"null amount", "POST", dep, `{"amountCents":null}`, 422, "VALIDATION_ERROR"},
		{"zero amount", "POST", dep, `{"amountCents":0}`, 422, "VALIDATION_ERROR"},
		{"negative amount", "POST", dep, `{"amountCents":-1}`, 422, "VALIDATION_ERROR"},
		{"above int32", "POST", dep, `{"amountCents":2147483648}`, 422, "VALIDATION_ERROR"},
		{"below int32", "POST", dep, `{"amountCents":-2147483649}`, 422, "VALIDATION_ERROR"},
		{"beyond int64", "POST", dep, `{"amountCents":1e30}`, 422, "VALIDATION_ERROR"},
		{"withdraw non-UUID path", "POST", "/api/accounts/not-a-uuid/withdraw", `{"amountCents":5}`, 400, "MALFORMED_REQUEST"},
		{"deposit non-UUID path", "POST", "/api/accounts/1234/deposit", `{"amountCents":5}`, 400, "MALFORMED_REQUEST"},
		{"balance non-UUID path", "GET", "/api/accounts/x/balance", "", 400, "MALFORMED_REQUEST"},
		{"history non-UUID path", "GET", "/api/accounts/x/history", "", 400, "MALFORMED_REQUEST"},
		{"bad minVersion", "GET", "/api/accounts/" + alice + "/balance?minVersion=-1", "", 400, "MALFORMED_REQUEST"},
		{"bad fromVersion", "GET", "/api/accounts/" + alice + "/history?fromVersion=abc", "", 400, "MALFORMED_REQUEST"},
		{"too large", "POST", dep, `{"amountCents":1` + strings.Repeat(" ", DefaultMaxBodyBytes) + `}`, 413, "PAYLOAD_TOO_LARGE"},
		{"unknown route", "GET", "/api/nope", "", 404, "NOT_FOUND"},
		{"wrong method", "DELETE", "/api/transfers", "", 405, "METHOD_NOT_ALLOWED"},
		{"GET on a POST route", "GET", dep, "", 405, "METHOD_NOT_ALLOWED"},
		{"root", "GET", "/", "", 404, "NOT_FOUND"},
		{"field name in another case too", "POST", dep, `{"amountCents":100,"AMOUNTCENTS":3}`, 422, "VALIDATION_ERROR"},
		{"field name in another case", "POST", dep, `{"AmountCents":100}`, 422, "VALIDATION_ERROR"},
		{"field repeated", "POST", dep, `{"amountCents":100,"amountCents":3}`, 422, "VALIDATION_ERROR"},
		{"deposit nil UUID path", "POST", "/api/accounts/" + uuid.Nil.String() + "/deposit", `{"amountCents":5}`, 422, "VALIDATION_ERROR"},
		{"withdraw nil UUID path", "POST", "/api/accounts/" + uuid.Nil.String() + "/withdraw", `{"amountCents":5}`, 422, "VALIDATION_ERROR"},
		{"balance nil UUID path", "GET", "/api/accounts/" + uuid.Nil.String() + "/balance", "", 422, "VALIDATION_ERROR"},
	}
	for _, c := range []struct{ name, body string }{
		{"transfer non-UUID from", `{"fromAccountId":"x","toAccountId":"` + alice + `","amountCents":1}`},
		{"transfer non-UUID to", `{"fromAccountId":"` + alice + `","toAccountId":"12","amountCents":1}`},
		{"transfer numeric id", `{"fromAccountId":5,"toAccountId":"` + alice + `","amountCents":1}`},
		{"transfer missing to", `{"fromAccountId":"` + alice + `","amountCents":1}`},
		{"transfer missing amount", `{"fromAccountId":"` + alice + `","toAccountId":"` + alice + `"}`},
		{"transfer amount overflow", `{"fromAccountId":"` + alice + `","toAccountId":"` + accounts.BobID.String() + `","amountCents":99999999999}`},
		{"transfer unknown field", `{"fromAccountId":"` + alice + `","toAccountId":"` + accounts.BobID.String() + `","amountCents":1,"x":1}`},
		{"transfer nil UUID from", `{"fromAccountId":"` + uuid.Nil.String() + `","toAccountId":"` + alice + `","amountCents":1}`},
		{"transfer nil UUID to", `{"fromAccountId":"` + alice + `","toAccountId":"` + uuid.Nil.String() + `","amountCents":1}`},
		{"transfer field in another case", `{"fromAccountId":"` + alice + `","toAccountId":"` + accounts.BobID.String() + `","amountCents":1,"TOACCOUNTID":"` + alice + `"}`},
	} {
		m, p, b := tr(c.body)
		cases = append(cases, tcase{c.name, m, p, b, 422, "VALIDATION_ERROR"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeService{}
			w := do(New(f, quiet), tc.method, tc.path, tc.body)
			checkProblem(t, w, tc.status, tc.code)
			if f.calls != 0 {
				t.Errorf("the service was called (%s)", f.op)
			}
		})
	}
}

func checkProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) map[string]any {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	// The casing rule: error is the business code as the reference spells it,
	// code is its lower-case form and ends the type URI; message repeats detail.
	if p["error"] != code || p["code"] != strings.ToLower(code) || p["type"] != ProblemTypePrefix+strings.ToLower(code) ||
		p["status"] != float64(status) || p["title"] == "" || p["message"] == "" || p["message"] != p["detail"] {
		t.Errorf("problem %v, want error %s, code %s", p, code, strings.ToLower(code))
	}
	return p
}

// TestErrorMapping: service errors to status, code and members (docs/account-service.md 1.3).
func TestErrorMapping(t *testing.T) {
	alice := accounts.AliceID.String()
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"validation", &accounts.ValidationError{Message: "Amount must be positive."}, 422, "VALIDATION_ERROR"},
		{"funds", fmt.Errorf("wrapped: %w", &accounts.InsufficientFundsError{BalanceCents: 205, RequestedCents: 100000}), 422, "INSUFFICIENT_FUNDS"},
		{"conflict", &accounts.ConflictError{Reason: "internal detail"}, 409, "CONFLICT"},
		{"unavailable", fmt.Errorf("%w: %w", accounts.ErrUnavailable, celeriant.ErrNotSent), 503, "SERVICE_UNAVAILABLE"},
		{"deadline", fmt.Errorf("loop: %w", context.DeadlineExceeded), 503, "SERVICE_UNAVAILABLE"},
		{"internal", errors.New("boom: secret detail"), 500, "INTERNAL_ERROR"},
	} {
		for _, route := range []struct{ method, path, body string }{
			{"POST", "/api/accounts/" + alice + "/deposit", `{"amountCents":5}`},
			{"POST", "/api/accounts/" + alice + "/withdraw", `{"amountCents":5}`},
			{"POST", "/api/transfers", `{"fromAccountId":"` + alice + `","toAccountId":"` + accounts.BobID.String() + `","amountCents":5}`},
			{"GET", "/api/accounts/" + alice + "/balance", ""},
			{"GET", "/api/accounts/" + alice + "/history", ""},
		} {
			t.Run(tc.name+" "+route.method+" "+route.path, func(t *testing.T) {
				w := do(New(&fakeService{err: tc.err}, quiet), route.method, route.path, route.body)
				p := checkProblem(t, w, tc.status, tc.code)
				if tc.code == "INSUFFICIENT_FUNDS" {
					if p["balanceCents"] != float64(205) || p["detail"] != "Cannot process $1000.00, balance is $2.05" {
						t.Errorf("funds problem %v", p)
					}
				} else if _, ok := p["balanceCents"]; ok {
					t.Error("balanceCents only on INSUFFICIENT_FUNDS")
				}
				if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "internal detail") {
					t.Error("internal error text leaked")
				}
				if (tc.status == 503 || tc.status == 409) && w.Header().Get("Retry-After") != "1" {
					t.Errorf("%d with Retry-After %q, want 1", tc.status, w.Header().Get("Retry-After"))
				}
			})
		}
	}
}

func TestRedirectPassesThrough(t *testing.T) {
	w := do(New(&fakeService{}, quiet), "GET", "/api//accounts", "")
	if w.Code/100 != 3 || w.Header().Get("Location") != "/api/accounts" {
		t.Errorf("status %d, Location %q", w.Code, w.Header().Get("Location"))
	}
}

// TestLandedFunc: the handler marks the service call's context with
// accounts.MayHaveLanded exactly when its LandedFunc says so, on every write route.
func TestLandedFunc(t *testing.T) {
	alice, bob := accounts.AliceID.String(), accounts.BobID.String()
	for _, route := range []struct{ path, body string }{
		{"/api/accounts/" + alice + "/deposit", `{"amountCents":5}`},
		{"/api/accounts/" + alice + "/withdraw", `{"amountCents":5}`},
		{"/api/transfers", `{"fromAccountId":"` + alice + `","toAccountId":"` + bob + `","amountCents":5}`},
	} {
		for _, takeover := range []bool{false, true} {
			f := &fakeService{}
			h := New(f, quiet, WithLandedFunc(func(r *http.Request) bool { return r.Header.Get("X-Takeover") == "1" }))
			req := httptest.NewRequest("POST", route.path, strings.NewReader(route.body))
			if takeover {
				req.Header.Set("X-Takeover", "1")
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 || f.landed != takeover {
				t.Errorf("%s takeover=%v: status %d, marked %v", route.path, takeover, w.Code, f.landed)
			}
		}
	}
}

// TestKeyFunc: with a key, the EventId is UUIDv5 over (scope, key); without, random.
func TestKeyFunc(t *testing.T) {
	path := "/api/accounts/" + accounts.AliceID.String() + "/deposit"
	f := &fakeService{}
	keyed := New(f, quiet, WithKeyFunc(func(r *http.Request) (string, string, bool) {
		k := r.Header.Get("Idempotency-Key")
		return r.Header.Get("X-Client-ID"), k, k != ""
	}))
	send := func(scope, key string) uuid.UUID {
		req := httptest.NewRequest("POST", path, strings.NewReader(`{"amountCents":5}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		req.Header.Set("X-Client-ID", scope)
		w := httptest.NewRecorder()
		keyed.ServeHTTP(w, req)
		if w.Code != 200 {
			t.Fatalf("status %d", w.Code)
		}
		return f.eventID
	}
	if got := send("tenant", "k1"); got != accounts.EventIDFor("tenant", "k1", accounts.Operation("deposit", 5, accounts.AliceID)) {
		t.Errorf("EventId %s, want EventIDFor(tenant, k1, deposit of 5 to Alice)", got)
	}
	if send("tenant", "k1") != send("tenant", "k1") || send("a", "k1") == send("b", "k1") {
		t.Error("EventId must be stable per (scope, key) and differ across scopes")
	}
	r1, r2 := send("tenant", ""), send("tenant", "")
	if r1 == r2 || r1 == uuid.Nil || r1.Version() != 4 {
		t.Errorf("keyless requests: %s, %s; want distinct random ids", r1, r2)
	}
	// No KeyFunc at all: random too.
	f2 := &fakeService{}
	do(New(f2, quiet), "POST", path, `{"amountCents":5}`)
	if f2.eventID == uuid.Nil || f2.eventID.Version() != 4 {
		t.Errorf("no KeyFunc: %s", f2.eventID)
	}
}

// TestEndToEnd runs the handler over a real service (simulator, memory projection) on two
// replicas: a keyed deposit retried on the other replica is answered, not rewritten.
func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	sim := celeriantsim.New(celeriantsim.Options{})
	keyFunc := WithKeyFunc(func(r *http.Request) (string, string, bool) {
		k := r.Header.Get("Idempotency-Key")
		return "anonymous", k, k != ""
	})
	var replicas []http.Handler
	for range 2 {
		svc, err := accounts.New(sim, accounts.NewMemoryProjection(), accounts.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Seed(ctx); err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, New(svc, quiet, keyFunc))
	}
	post := func(h http.Handler, path, key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	dep := "/api/accounts/" + accounts.BobID.String() + "/deposit"
	w1 := post(replicas[0], dep, "not-a-uuid-key", `{"amountCents":500}`)
	w2 := post(replicas[1], dep, "not-a-uuid-key", `{"amountCents":500}`)
	if w1.Code != 200 || w1.Body.String() != w2.Body.String() || strings.TrimSpace(w1.Body.String()) != `{"balanceCents":25500,"aggregateVersion":2}` {
		t.Fatalf("deposit %d %s / retry %d %s", w1.Code, w1.Body, w2.Code, w2.Body)
	}
	w := post(replicas[1], "/api/accounts/"+accounts.CharlieID.String()+"/withdraw", "w1", `{"amountCents":999999}`)
	if p := checkProblem(t, w, 422, "INSUFFICIENT_FUNDS"); p["balanceCents"] != float64(10000) {
		t.Errorf("funds problem %v", p)
	}
	w = post(replicas[0], "/api/transfers", "t1", `{"fromAccountId":"`+accounts.BobID.String()+`","toAccountId":"`+accounts.BobID.String()+`","amountCents":1}`)
	checkProblem(t, w, 422, "VALIDATION_ERROR")
	w = do(replicas[1], "GET", "/api/accounts/"+accounts.BobID.String()+"/history", "")
	var h struct {
		Events []struct {
			Type        string `json:"type"`
			AmountCents int32  `json:"amountCents"`
		} `json:"events"`
		CurrentAggregateVersion uint64 `json:"currentAggregateVersion"`
		BalanceCents            int64  `json:"balanceCents"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &h); err != nil || len(h.Events) != 2 || h.BalanceCents != 25500 || h.CurrentAggregateVersion != 2 {
		t.Errorf("history %s (%v)", w.Body, err)
	}
	// 503 when the event store is gone.
	_ = sim.Close()
	w = post(replicas[0], dep, "k-after-close", `{"amountCents":1}`)
	checkProblem(t, w, 503, "SERVICE_UNAVAILABLE")
}

// FuzzBodies: no body on a write route yields anything but 200, 400, 413 or 422 with a
// well-formed answer; never a 500 or a panic.
func FuzzBodies(f *testing.F) {
	for _, s := range []string{`{"amountCents":5}`, `{"amountCents":-1}`, `{`, `[]`, `null`, `{"amountCents":1e3}`,
		`{"fromAccountId":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e","toAccountId":"x","amountCents":1}`, "\x00", `{"amountCents":5}//`} {
		f.Add(s)
	}
	h := New(&fakeService{}, quiet)
	paths := []string{"/api/accounts/" + accounts.AliceID.String() + "/deposit", "/api/transfers"}
	f.Fuzz(func(t *testing.T, body string) {
		for _, p := range paths {
			w := do(h, "POST", p, body)
			switch w.Code {
			case 200:
			case 400, 413, 422:
				var pr map[string]any
				if err := json.Unmarshal(w.Body.Bytes(), &pr); err != nil || pr["code"] == nil {
					t.Fatalf("%s %q: bad problem %s", p, body, w.Body)
				}
			default:
				t.Fatalf("%s %q: status %d", p, body, w.Code)
			}
		}
	})
}
