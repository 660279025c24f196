package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/outbox"
)

// databaseURL returns DATABASE_URL (see serverURL).
func databaseURL(t testing.TB) string {
	t.Helper()
	return serverURL(t, "DATABASE_URL", "a Postgres server")
}

// serverURL returns the environment variable name, the address of a server the
// test needs (what); without it the test fails under CI=true and is skipped
// otherwise, naming the variable.
func serverURL(t testing.TB, name, what string) string {
	t.Helper()
	return testenv.Getenv(t, name, what)
}

// testPool connects to DATABASE_URL and picks a table prefix of the test's own;
// its tables are dropped at cleanup.
func testPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "pay" + store.NewToken().String()[:10] + "_"
	t.Cleanup(func() {
		defer pool.Close()
		var tables []string
		for _, name := range []string{"payments", "payment_transitions", "idemkey_records", "idemkey_records_migrations",
			"webhook_inbox", "webhook_inbox_migrations", "outbox", "outbox_migrations", "receipts", "receipts_inbox", "receipts_inbox_migrations"} {
			tables = append(tables, pgx.Identifier{prefix + name}.Sanitize())
		}
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+strings.Join(tables, ", "))
		if err != nil {
			t.Errorf("dropping the test's tables: %v", err)
		}
	})
	return pool, prefix
}

// testServer is the payments handler in-process over httptest, on its own
// tables, with an in-process fake gateway.
type testServer struct {
	URL      string
	gateway  *fakegateway.Gateway
	gwURL    string
	pool     *pgxpool.Pool
	prefix   string
	payments *payments
	outbox   *outbox.Outbox
}

// newTestServer serves the payments API on fresh tables; cfg's zero fields get
// the defaults of loadConfig.
func newTestServer(t *testing.T, env map[string]string) *testServer {
	t.Helper()
	pool, prefix := testPool(t)
	g := fakegateway.New(fakegateway.Faults{}, nil)
	gw := httptest.NewServer(g)
	t.Cleanup(gw.Close)
	ts := &testServer{gateway: g, gwURL: gw.URL, pool: pool, prefix: prefix}
	ts.URL = ts.start(t, env, gw.URL)
	return ts
}

// start serves another instance of the API on ts's tables, charging through
// gatewayURL, and returns its URL.
func (ts *testServer) start(t *testing.T, env map[string]string, gatewayURL string) string {
	t.Helper()
	full := map[string]string{"DATABASE_URL": "set", "PAYMENTS_TABLE_PREFIX": ts.prefix}
	for k, v := range env {
		full[k] = v
	}
	cfg, err := loadConfig(func(k string) string { return full[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	records, err := postgres.New(ts.pool, postgres.WithTable(cfg.tablePrefix+"idemkey_records"))
	if err != nil {
		t.Fatal(err)
	}
	if err := records.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ts.payments = newPayments(ts.pool, cfg.tablePrefix)
	if err := ts.payments.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	gw, err := newGatewayClient(gatewayURL, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ob, hooks, err := openOutboxInbox(ctx, ts.pool, cfg.tablePrefix)
	if err != nil {
		t.Fatal(err)
	}
	ts.outbox = ob
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := newHandler(cfg, &api{pool: ts.pool, records: records, payments: ts.payments, gateway: gw, logger: logger,
		outbox: ob, webhooks: hooks, webhookSecret: []byte(cfg.webhookSecret), webhookTolerance: cfg.webhookTolerance}, logger)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func (ts *testServer) rows(t testing.TB) int {
	t.Helper()
	n, err := ts.payments.count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// answer is an HTTP answer, read whole.
type answer struct {
	Status   int
	Header   http.Header
	Body     string
	Replayed bool
}

// problemCode returns the "code" member of a problem body.
func (a answer) problemCode() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(a.Body), &p)
	return p.Code
}

// problemType returns the "type" member of a problem body.
func (a answer) problemType() string {
	var p struct{ Type string }
	_ = json.Unmarshal([]byte(a.Body), &p)
	return p.Type
}

func (a answer) payment(t testing.TB) Payment {
	t.Helper()
	var p Payment
	if err := json.Unmarshal([]byte(a.Body), &p); err != nil || p.ID == "" {
		t.Fatalf("not a payment: %d %s (%v)", a.Status, a.Body, err)
	}
	return p
}

// do sends a request; headers are name, value pairs. A transport error is returned.
func do(client *http.Client, method, url, body string, headers ...string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		return answer{}, err
	}
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: b.String(), Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

// mustDo is do failing the test on a transport error.
func mustDo(t testing.TB, method, url, body string, headers ...string) answer {
	t.Helper()
	a, err := do(http.DefaultClient, method, url, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// pay posts body to base's /payments with the demo token and key.
func pay(t testing.TB, base, key, body string, headers ...string) answer {
	t.Helper()
	return mustDo(t, http.MethodPost, base+"/payments", body, append([]string{"Authorization", "Bearer demo", "Idempotency-Key", `"` + key + `"`}, headers...)...)
}

const payBody = `{"amountCents":1250,"currency":"EUR","customerId":"cust-1"}`

// payConcurrently makes n payments on base from 8 goroutines, payment i with
// amount 100+i and Idempotency-Key "<keyPrefix>-<i>", and calls then (if not
// nil, from those goroutines) with each 201's payment; any other answer is a
// test error.
func payConcurrently(t *testing.T, base string, n int, keyPrefix string, then func(i int, p Payment)) {
	t.Helper()
	var wg sync.WaitGroup
	keys := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range keys {
				a, err := do(http.DefaultClient, http.MethodPost, base+"/payments",
					fmt.Sprintf(`{"amountCents":%d,"currency":"EUR","customerId":"c-%d"}`, 100+i, i),
					"Authorization", "Bearer demo", "Idempotency-Key", fmt.Sprintf(`"%s-%d"`, keyPrefix, i))
				if err != nil || a.Status != http.StatusCreated {
					t.Errorf("payment %d: %v %d %s", i, err, a.Status, a.Body)
					continue
				}
				if then != nil {
					var p Payment
					if err := json.Unmarshal([]byte(a.Body), &p); err != nil {
						t.Errorf("payment %d: %v in %s", i, err, a.Body)
						continue
					}
					then(i, p)
				}
			}
		})
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()
}

// waitFor polls cond (state another process or the gateway's delivery
// goroutines change, with nothing to wait on) every 20ms, until the test's
// deadline less a margin to report it, or for 5 minutes without -timeout: a
// busy machine slows the test down, it does not fail it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-10 * time.Second)
	}
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
