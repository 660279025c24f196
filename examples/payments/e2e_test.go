package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

// stack is the fake gateway and the payments server as separate processes, on
// tables of the test's own.
type stack struct {
	gateway  *proctest.Proc
	payments []*proctest.Proc
	bin      string   // the payments binary, to start more
	env      []string // its environment
	ts       *testServer
}

// startStack builds and starts the gateway with gatewayEnv and n payments
// processes with paymentsEnv added to ADDR, DATABASE_URL, GATEWAY_URL and
// PAYMENTS_TABLE_PREFIX.
func startStack(t *testing.T, n int, gatewayEnv, paymentsEnv []string) *stack {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the tests with processes")
	}
	dbURL := databaseURL(t)
	pool, prefix := testPool(t)
	gwBin := proctest.Build(t, "./gateway", "gateway")
	bin := proctest.Build(t, ".", "payments")
	s := &stack{bin: bin, ts: &testServer{pool: pool, prefix: prefix, payments: newPayments(pool, prefix)}}
	s.gateway = proctest.Start(t, gwBin, append([]string{"ADDR=127.0.0.1:0"}, gatewayEnv...)...)
	s.env = append([]string{"ADDR=127.0.0.1:0", "DATABASE_URL=" + dbURL, "GATEWAY_URL=" + s.gateway.URL, "PAYMENTS_TABLE_PREFIX=" + prefix}, paymentsEnv...)
	for range n {
		s.start(t)
	}
	return s
}

// start starts one more payments process.
func (s *stack) start(t *testing.T) *proctest.Proc {
	t.Helper()
	p := proctest.Start(t, s.bin, s.env...)
	s.payments = append(s.payments, p)
	return p
}

// charges lists the gateway's charges.
func (s *stack) charges(t testing.TB) []fakegateway.Charge {
	t.Helper()
	a := mustDo(t, http.MethodGet, s.gateway.URL+"/charges", "")
	var out []fakegateway.Charge
	if err := json.Unmarshal([]byte(a.Body), &out); a.Status != http.StatusOK || err != nil {
		t.Fatalf("GET /charges: %d %s (%v)", a.Status, a.Body, err)
	}
	return out
}

// TestPaymentsStorm: 500 payments over real TCP and real Postgres, each key sent
// 4 times at once (2 copies to each of two payments processes sharing the
// tables), with the gateway, a separate process, losing 20% of its answers after
// charging and failing 10% with 503. Clients retry network errors, 409 and 503
// with the same key. Then: exactly 500 charges at the gateway, one per key, and
// 500 rows, one per charge; every copy's final answer for a key is a 201 equal
// (status and body bytes) to the first final answer for it.
func TestPaymentsStorm(t *testing.T) {
	const (
		keys    = 500
		copies  = 4
		inFlght = 24 // keys in flight at once: up to 96 concurrent clients
	)
	s := startStack(t, 2, []string{"GATEWAY_LOSE_RATE=0.2", "GATEWAY_FAIL_RATE=0.1"}, nil)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}

	type final struct {
		status int
		body   string
		at     time.Time
	}
	var (
		mu       sync.Mutex
		finals   = make(map[string][]final, keys)
		byStatus = make(map[string]int) // every answer, by status (and "replayed", "network")
	)
	count := func(k string) { mu.Lock(); byStatus[k]++; mu.Unlock() }
	body := func(i int) string {
		return fmt.Sprintf(`{"amountCents":%d,"currency":"EUR","customerId":"cust-%d"}`, 100+i, i%7)
	}
	// send posts one copy until a final answer; at most 2 minutes per copy.
	send := func(base, key, body string) (final, error) {
		deadline := time.Now().Add(2 * time.Minute)
		for attempt := 1; ; attempt++ {
			a, err := do(client, http.MethodPost, base+"/payments", body, "Authorization", "Bearer demo", "Idempotency-Key", `"`+key+`"`)
			switch {
			case err != nil:
				count("network error")
			case a.Status == http.StatusConflict || a.Status == http.StatusServiceUnavailable:
				count(strconv.Itoa(a.Status) + " " + a.problemCode())
			default:
				if a.Replayed {
					count(strconv.Itoa(a.Status) + " replayed")
				} else {
					count(strconv.Itoa(a.Status))
				}
				return final{a.Status, a.Body, time.Now()}, nil
			}
			if time.Now().After(deadline) {
				return final{}, fmt.Errorf("key %s: no final answer after %d attempts (last: %v %d %s)", key, attempt, err, a.Status, a.Body)
			}
			// A short back-off instead of the whole Retry-After (the rest of the
			// lease), so the storm stays quick: retrying early is always safe.
			time.Sleep(time.Duration(min(attempt, 10)) * 10 * time.Millisecond) // polling another process
		}
	}

	start := time.Now()
	var failed atomic.Pointer[error]
	sem := make(chan struct{}, inFlght)
	var wg sync.WaitGroup
	for i := range keys {
		sem <- struct{}{}
		key := fmt.Sprintf("storm-%03d", i)
		var kwg sync.WaitGroup
		for c := range copies {
			kwg.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer kwg.Done()
				f, err := send(s.payments[c%2].URL, key, body(i))
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				mu.Lock()
				finals[key] = append(finals[key], f)
				mu.Unlock()
			}()
		}
		go func() { kwg.Wait(); <-sem }()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := failed.Load(); err != nil {
		t.Fatal(*err)
	}
	t.Logf("storm: %d keys x %d copies in %v; answers by status: %v", keys, copies, elapsed.Round(time.Millisecond), byStatus)

	chargeOf := make(map[string]string) // provider charge id -> gateway key
	for _, c := range s.charges(t) {
		if prev, dup := chargeOf[c.ID]; dup {
			t.Fatalf("charge %s listed twice (%s, %s)", c.ID, prev, c.IdempotencyKey)
		}
		chargeOf[c.ID] = c.IdempotencyKey
	}
	if len(chargeOf) != keys {
		t.Fatalf("%d charges at the gateway, want exactly %d", len(chargeOf), keys)
	}
	if n := s.ts.rows(t); n != keys {
		t.Fatalf("%d payment rows, want exactly %d", n, keys)
	}
	seen := make(map[string]bool)
	for i := range keys {
		key := fmt.Sprintf("storm-%03d", i)
		fs := finals[key]
		if len(fs) != copies {
			t.Fatalf("key %s: %d final answers, want %d", key, len(fs), copies)
		}
		first := fs[0]
		for _, f := range fs {
			if f.at.Before(first.at) {
				first = f
			}
		}
		for _, f := range fs {
			if f.status != http.StatusCreated || f.body != first.body {
				t.Fatalf("key %s: final answer %d %s differs from the first, %d %s", key, f.status, f.body, first.status, first.body)
			}
		}
		var p Payment
		if err := json.Unmarshal([]byte(first.body), &p); err != nil {
			t.Fatal(err)
		}
		if chargeOf[p.ProviderChargeID] != "merchant-demo:"+key || p.AmountCents != int64(100+i) || seen[p.ID] {
			t.Fatalf("key %s: payment %+v does not match its own charge (%q) or repeats an id", key, p, chargeOf[p.ProviderChargeID])
		}
		seen[p.ID] = true
		got, err := s.ts.payments.get(context.Background(), "merchant-demo", p.ID)
		if err != nil || got != p {
			t.Fatalf("key %s: row %+v (%v), want the answered %+v", key, got, err, p)
		}
	}
}

// TestCrashThenRetry: the payments process kills itself with SIGKILL inside a
// payment (X-Fault, PAYMENTS_FAULTS=1), and the client retries the same request,
// without the header, on a fresh process on the same tables.
//
//   - crash-after-commit: the payment and its idempotency record committed
//     together; the retry replays the committed payment, one charge, one row.
//   - crash-before-commit: nothing committed; once the dead holder's lease
//     expires the retry runs again, the gateway's key deduplication answers the
//     first charge, and the outcome is one charge and one row.
func TestCrashThenRetry(t *testing.T) {
	for _, tc := range []struct {
		fault        string
		rowsAtCrash  int
		wantReplayed bool
	}{
		{"crash-after-commit", 1, true},
		{"crash-before-commit", 0, false},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			const lease = time.Second
			s := startStack(t, 1, nil, []string{"PAYMENTS_FAULTS=1", "IDEM_LEASE=" + lease.String()})
			const key = "crash-1"
			crashed := s.payments[0]
			_, err := do(http.DefaultClient, http.MethodPost, crashed.URL+"/payments", payBody,
				"Authorization", "Bearer demo", "Idempotency-Key", key, "X-Fault", tc.fault)
			if err == nil {
				t.Fatal("the request with the fault was answered; want the process dead before it answers")
			}
			crashed.Kill() // reaps the process, which already died of its own SIGKILL
			if n, rows := len(s.charges(t)), s.ts.rows(t); n != 1 || rows != tc.rowsAtCrash {
				t.Fatalf("after the crash: %d charges, %d rows; want 1, %d", n, rows, tc.rowsAtCrash)
			}

			fresh := s.start(t)
			var retry answer
			proctest.WaitFor(t, "a final answer to the retry", func() bool {
				retry = pay(t, fresh.URL, key, payBody)
				return retry.Status != http.StatusConflict // the dead holder's lease, until it expires
			})
			if retry.Status != http.StatusCreated || retry.Replayed != tc.wantReplayed {
				t.Fatalf("retry: %d replayed=%v %s; want 201 replayed=%v", retry.Status, retry.Replayed, retry.Body, tc.wantReplayed)
			}
			p := retry.payment(t)
			charges := s.charges(t)
			if len(charges) != 1 || s.ts.rows(t) != 1 || p.ProviderChargeID != charges[0].ID {
				t.Fatalf("after the retry: %+v and %d rows; want the payment's one charge and one row", charges, s.ts.rows(t))
			}
			if got, err := s.ts.payments.get(context.Background(), "merchant-demo", p.ID); err != nil || got != p {
				t.Fatalf("row %+v (%v), want the answered payment %+v", got, err, p)
			}
			if again := pay(t, fresh.URL, key, payBody); again.Status != http.StatusCreated || !again.Replayed || again.Body != retry.Body {
				t.Fatalf("second retry: %d replayed=%v %s, want the retry's answer replayed", again.Status, again.Replayed, again.Body)
			}
		})
	}
}

// TestSlowFaultHoldsTheKey: X-Fault slow=<d> sleeps inside the transaction; a
// copy sent meanwhile gets 409 request_in_flight with Retry-After, and after the
// first answer the copy replays it.
func TestSlowFaultHoldsTheKey(t *testing.T) {
	s := startStack(t, 1, nil, []string{"PAYMENTS_FAULTS=1"})
	base := s.payments[0].URL
	firstDone := make(chan answer, 1)
	go func() {
		a, err := do(http.DefaultClient, http.MethodPost, base+"/payments", payBody,
			"Authorization", "Bearer demo", "Idempotency-Key", "slow-1", "X-Fault", "slow=2500ms")
		if err != nil {
			a.Body = err.Error()
		}
		firstDone <- a
	}()
	proctest.WaitFor(t, "the charge of the slow request", func() bool { return len(s.charges(t)) == 1 })
	dup := pay(t, base, "slow-1", payBody)
	if dup.Status != http.StatusConflict || dup.problemCode() != "request_in_flight" || dup.Header.Get("Retry-After") == "" {
		t.Fatalf("copy during the slow transaction: %d %v %s, want 409 request_in_flight with Retry-After", dup.Status, dup.Header, dup.Body)
	}
	first := <-firstDone
	if first.Status != http.StatusCreated {
		t.Fatalf("slow request: %d %s", first.Status, first.Body)
	}
	if again := pay(t, base, "slow-1", payBody); !again.Replayed || again.Body != first.Body {
		t.Fatalf("copy after: %d replayed=%v %s, want the first answer replayed", again.Status, again.Replayed, again.Body)
	}
}

// TestMissingDatabaseURL: without DATABASE_URL the server says so and exits 2.
func TestMissingDatabaseURL(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the tests with processes")
	}
	bin := proctest.Build(t, ".", "payments")
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "DATABASE_URL is required") {
		t.Fatalf("exit %v, output %q; want exit status 2 naming DATABASE_URL", err, out)
	}
}
