package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
)

// TestScenariosOverHTTP repeats docs/account-service.md section 5.2 scenarios 1-8 through the
// handler (no middleware), two replicas over one simulated log (or the real server at
// CELERIANT_ADDR), keys in the Idempotency-Key header, and checks status and JSON of
// each answer and the log.
func TestScenariosOverHTTP(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	var log celeriant.EventStore = sim
	run := "" // a suffix for the account names: a real server keeps earlier runs' streams
	// The server (and the simulator, with its default commit delay) makes a write
	// readable only after its fsync window (docs/celeriant-protocol.md section 6.5), so
	// a backoff after a 2003 must outlast it: on the simulator it waits until no write
	// is in flight, on a real server it really sleeps.
	sleep := func(ctx context.Context, _ time.Duration) error {
		select {
		case <-sim.Settled():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if addr := os.Getenv("CELERIANT_ADDR"); addr != "" {
		c, err := celeriant.New(celeriant.Config{Addrs: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		log, run, sleep = c, "-"+uuid.NewString(), nil
	}
	var pods [2]http.Handler
	for i := range pods {
		svc, err := accounts.New(log, accounts.NewMemoryProjection(),
			accounts.WithLogger(slog.New(slog.DiscardHandler)), accounts.WithSleep(sleep))
		if err != nil {
			t.Fatal(err)
		}
		pods[i] = New(svc, quiet, WithKeyFunc(func(r *http.Request) (string, string, bool) {
			k := r.Header.Get("Idempotency-Key")
			return "scenario-tenant", k, k != ""
		}))
	}
	acct := uuid.NewSHA1(accounts.ReferenceNamespace, []byte("http-suite-acct-1"+run))
	acct2 := uuid.NewSHA1(accounts.ReferenceNamespace, []byte("http-suite-acct-2"+run))
	call := func(pod int, path, key, body string) (int, string) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		pods[pod].ServeHTTP(w, req)
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	dep := "/api/accounts/" + acct.String() + "/deposit"
	expect := func(step string, code int, body string, wantCode int, wantBody string) {
		t.Helper()
		if code != wantCode || (wantBody != "" && body != wantBody) {
			t.Fatalf("%s: %d %s; want %d %s", step, code, body, wantCode, wantBody)
		}
	}
	c, b := call(0, dep, "k1", `{"amountCents":100}`)
	expect("1", c, b, 200, `{"balanceCents":100,"aggregateVersion":1}`)
	c, b = call(0, dep, "k1", `{"amountCents":100}`)
	expect("2", c, b, 200, `{"balanceCents":100,"aggregateVersion":1}`)
	c, b = call(0, dep, "k2", `{"amountCents":50}`)
	expect("3a", c, b, 200, `{"balanceCents":150,"aggregateVersion":2}`)
	c, b = call(1, dep, "k2", `{"amountCents":50}`)
	expect("3b", c, b, 200, `{"balanceCents":150,"aggregateVersion":2}`)

	concurrently := func(a, b func() (int, string)) [2][2]any {
		var out [2][2]any
		var wg sync.WaitGroup
		for i, f := range []func() (int, string){a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); c, s := f(); out[i] = [2]any{c, s} }()
		}
		wg.Wait()
		return out
	}
	r := concurrently(
		func() (int, string) { return call(0, dep, "k3", `{"amountCents":25}`) },
		func() (int, string) { return call(1, dep, "k3", `{"amountCents":25}`) })
	for i := range r {
		expect("4", r[i][0].(int), r[i][1].(string), 200, `{"balanceCents":175,"aggregateVersion":3}`)
	}
	r = concurrently(
		func() (int, string) { return call(0, dep, "k4", `{"amountCents":10}`) },
		func() (int, string) { return call(1, dep, "k5", `{"amountCents":20}`) })
	for i := range r {
		expect("5", r[i][0].(int), r[i][1].(string), 200, "")
	}
	c, b = call(0, "/api/accounts/"+acct.String()+"/withdraw", "k6", `{"amountCents":100000}`)
	if c != 422 || !strings.Contains(b, `"error":"INSUFFICIENT_FUNDS"`) || !strings.Contains(b, `"balanceCents":205`) {
		t.Fatalf("6: %d %s", c, b)
	}
	transfer := `{"fromAccountId":"` + acct.String() + `","toAccountId":"` + acct2.String() + `","amountCents":105}`
	wantTr := `{"from":{"balanceCents":100,"aggregateVersion":6},"to":{"balanceCents":105,"aggregateVersion":1}}`
	c, b = call(0, "/api/transfers", "k7", transfer)
	expect("7a", c, b, 200, wantTr)
	c, b = call(1, "/api/transfers", "k7", transfer)
	expect("7b", c, b, 200, wantTr)
	c, b = call(1, dep, "k8", `{"amountCents":7}`)
	expect("8a", c, b, 200, `{"balanceCents":107,"aggregateVersion":7}`)
	c, b = call(0, dep, "k9", `{"amountCents":9}`)
	expect("8b", c, b, 200, `{"balanceCents":116,"aggregateVersion":8}`)
	c, b = call(0, dep, "k1", `{"amountCents":100}`)
	expect("8c", c, b, 200, `{"balanceCents":100,"aggregateVersion":1}`)

	// The key k1 reused for other operations once the middleware forgot it (nothing in
	// front of this handler remembers it): each is its own request, not k1's deposit.
	c, b = call(0, "/api/transfers", "k1", `{"fromAccountId":"`+acct.String()+`","toAccountId":"`+acct2.String()+`","amountCents":20000}`)
	if c != 422 || !strings.Contains(b, `"error":"INSUFFICIENT_FUNDS"`) {
		t.Fatalf("k1 as a transfer over the balance: %d %s, want 422 INSUFFICIENT_FUNDS", c, b)
	}
	c, b = call(1, "/api/accounts/"+acct.String()+"/withdraw", "k1", `{"amountCents":5}`)
	expect("k1 as a withdrawal", c, b, 200, `{"balanceCents":111,"aggregateVersion":9}`)

	// The log itself: 9 events on acct, 1 on acct2, each keyed request exactly once.
	count := map[uuid.UUID]int{}
	for id, want := range map[uuid.UUID]int{acct: 9, acct2: 1} {
		batches, err := celeriant.ReadAll(context.Background(), log, celeriant.ReadRequest{Key: accounts.Key(id), Filters: celeriant.ReadFilters{FromVersion: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if len(batches) != want {
			t.Errorf("%s: %d batches, want %d", id, len(batches), want)
		}
		for _, bt := range batches {
			for _, ev := range bt.Events {
				count[ev.EventID]++
			}
		}
	}
	for k, amount := range map[string]int32{"k1": 100, "k2": 50, "k3": 25, "k4": 10, "k5": 20, "k8": 7, "k9": 9} {
		if n := count[accounts.EventIDFor("scenario-tenant", k, accounts.Operation("deposit", amount, acct))]; n != 1 {
			t.Errorf("%s landed %d times", k, n)
		}
	}
	if n := count[accounts.EventIDFor("scenario-tenant", "k7", accounts.Operation("transfer", 105, acct, acct2))]; n != 2 { // one per leg
		t.Errorf("k7 on %d legs, want 2", n)
	}
}
