package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
)

// build compiles the main package in dir (relative to this one) into the test's
// temporary directory.
func build(t *testing.T, dir, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// startProcess runs bin with env added to the test's environment, waits for its
// "listening on X" line and returns X. At cleanup it sends SIGTERM and expects a
// clean exit.
func startProcess(t *testing.T, bin string, env ...string) string {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = &logTail{t: t, name: filepath.Base(bin)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s exited with %v after SIGINT", bin, err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("%s printed no listening line: %v", bin, err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok {
		t.Fatalf("%s: unexpected first line %q", bin, line)
	}
	return addr
}

// logTail forwards a process's warnings and errors to the test log.
type logTail struct {
	t    *testing.T
	name string
	mu   sync.Mutex
	buf  []byte
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			l.t.Logf("%s: %s", l.name, line)
		}
	}
}

// TestEndToEndStorm is item 6 of issue 6: cmd/celeriant-sim and two nethttp
// processes sharing one Postgres store (and projection) and the simulator, driven
// by vegeta with 5,000 deposits over 500 keys, every key sent 10 times, 5 to each
// replica, copies of a key concurrently. From the event log: each key wrote
// exactly one event and each account's balance is the sum of its distinct
// deposits. No answer is a 5xx or a transport error.
func TestEndToEndStorm(t *testing.T) {
	const (
		keys     = 500
		copies   = 10 // per key, alternating replicas
		nAccount = 20 // keys spread over accounts: concurrent writes to one aggregate
		scope    = "e2e"
	)
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true but DATABASE_URL is not set")
		}
		t.Skip("DATABASE_URL not set: skipping the two-replica storm against Postgres")
	}
	sfx := apptest.RandomSuffix()
	table, prefix := "idem_e2e_"+sfx, "e2e_"+sfx+"_"
	t.Cleanup(func() { apptest.DropTables(t, dbURL, table, prefix) })

	simAddr := startProcess(t, build(t, "../../cmd/celeriant-sim", "celeriant-sim"), "ADDR=127.0.0.1:0")
	server := build(t, ".", "nethttp")
	env := []string{"ADDR=127.0.0.1:0", "IDEM_STORE=postgres", "DATABASE_URL=" + dbURL, "IDEM_TABLE=" + table,
		"PROJECTION=postgres", "ACCOUNTS_TABLE_PREFIX=" + prefix, "CELERIANT_ADDR=" + simAddr}
	replicas := []string{startProcess(t, server, env...), startProcess(t, server, env...)}

	accts := make([]uuid.UUID, nAccount)
	for i := range accts {
		accts[i] = uuid.New()
	}
	keyName := func(i int) string { return fmt.Sprintf("dep-%03d", i) }
	amount := func(i int) int64 { return int64(100 + i) } // distinct per key
	target := func(i, replica int) vegeta.Target {
		return vegeta.Target{
			Method: "POST",
			URL:    replicas[replica] + "/api/accounts/" + accts[i%nAccount].String() + "/deposit",
			Body:   fmt.Appendf(nil, `{"amountCents":%d}`, amount(i)),
			Header: http.Header{"Idempotency-Key": {keyName(i)}, "X-Client-Id": {scope}, "Content-Type": {"application/json"}},
		}
	}
	// Copies of a key are adjacent, so the workers send them at the same time.
	var targets []vegeta.Target
	for i := range keys {
		for c := range copies {
			targets = append(targets, target(i, c%2))
		}
	}

	attacker := vegeta.NewAttacker(vegeta.Workers(64), vegeta.MaxWorkers(64), vegeta.Connections(64), vegeta.Timeout(30*time.Second))
	statuses := map[uint16]int{}
	executed := 0            // 200s that were not replays
	inFlight, gaveUp := 0, 0 // 409s: key held by a copy, write loop out of attempts
	var metrics vegeta.Metrics
	for res := range attacker.Attack(listTargeter(targets), vegeta.Rate{}, 2*time.Minute, "e2e") {
		if res.Code == 0 && res.Error == vegeta.ErrNoTargets.Error() {
			continue // a worker found the list exhausted; nothing was sent
		}
		metrics.Add(res)
		statuses[res.Code]++
		switch {
		case res.Code == 0:
			t.Errorf("transport error: %s", res.Error)
		case res.Code >= 500:
			t.Errorf("5xx answer %d: %.300s", res.Code, res.Body)
		case res.Code == http.StatusOK:
			if res.Headers.Get("Idempotent-Replayed") == "" {
				executed++
			}
		case res.Code == http.StatusConflict: // in flight, or the write loop gave up: retry
			if strings.Contains(string(res.Body), `"code":"request_in_flight"`) {
				inFlight++
			} else {
				gaveUp++
			}
		default:
			t.Errorf("unexpected answer %d: %.300s", res.Code, res.Body)
		}
	}
	metrics.Close()
	if metrics.Requests != uint64(len(targets)) {
		t.Fatalf("sent %d requests, want %d", metrics.Requests, len(targets))
	}
	t.Logf("storm: %d requests over 2 replicas in %v: %.0f req/s, p50 %v, p90 %v, p99 %v, max %v; statuses %v (409: %d in flight, %d write loop gave up); %d executions for %d keys",
		metrics.Requests, metrics.Duration.Round(time.Millisecond), metrics.Rate, metrics.Latencies.P50, metrics.Latencies.P90,
		metrics.Latencies.P99, metrics.Latencies.Max, statuses, inFlight, gaveUp, executed, keys)
	if executed > keys {
		t.Errorf("%d executions answered for %d keys: a key ran twice", executed, keys)
	}

	// A client retries a key until it gets its answer (keys whose copies all met a
	// 409 have not run yet). Every key must then be answered 200.
	settle(t, replicas, keys, func(i int) vegeta.Target { return target(i, i%2) })

	// The event log decides.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := celeriant.Dial(ctx, simAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	seen := map[uuid.UUID]int{}
	for a, acct := range accts {
		batches, err := celeriant.ReadAll(ctx, client, celeriant.ReadRequest{Key: accounts.Key(acct), Filters: celeriant.ReadFilters{FromVersion: 1}})
		if err != nil {
			t.Fatalf("reading account %s: %v", acct, err)
		}
		var balance, want int64
		for _, b := range batches {
			for _, e := range b.Events {
				seen[e.EventID]++
				var p struct{ AmountCents int64 }
				if accounts.EventType(e.TypeMajor) != accounts.Deposited || json.Unmarshal(e.Value, &p) != nil {
					t.Errorf("account %s: unexpected event %d %q", acct, e.TypeMajor, e.Value)
				}
				balance += p.AmountCents
			}
		}
		for i := a; i < keys; i += nAccount {
			want += amount(i)
		}
		if balance != want {
			t.Errorf("account %s: balance from the log %d, want %d (the sum of its distinct deposits)", acct, balance, want)
		}
		for _, base := range replicas {
			r := apptest.Do(t, "GET", base+"/api/accounts/"+acct.String()+"/balance", "", "", "")
			if !strings.Contains(r.Body, fmt.Sprintf(`"balanceCents":%d,`, want)) {
				t.Errorf("%s says %s for %s, want balance %d", base, r.Body, acct, want)
			}
		}
	}
	total := 0
	for i := range keys {
		n := seen[accounts.EventIDFor(scope, keyName(i))]
		total += n
		if n != 1 {
			t.Errorf("key %s: %d events in the log, want exactly 1", keyName(i), n)
		}
	}
	if len(seen) != keys || total != keys {
		t.Errorf("log holds %d distinct event ids, %d events of our keys; want %d and %d", len(seen), total, keys, keys)
	}
}

// settle sends every key once more, retrying 409s, until each is answered 200.
func settle(t *testing.T, replicas []string, keys int, target func(i int) vegeta.Target) {
	t.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	httpc := &http.Client{Timeout: 30 * time.Second}
	for range 16 {
		wg.Go(func() {
			for i := range work {
				tg := target(i)
				for attempt := 1; ; attempt++ {
					req, _ := http.NewRequest(tg.Method, tg.URL, strings.NewReader(string(tg.Body)))
					req.Header = tg.Header.Clone()
					resp, err := httpc.Do(req)
					if err != nil {
						t.Errorf("settling key %d: %v", i, err)
						break
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
					if resp.StatusCode != http.StatusConflict || attempt == 50 {
						t.Errorf("settling key %d: %d %s after %d attempts", i, resp.StatusCode, body, attempt)
						break
					}
					time.Sleep(20 * time.Millisecond) // the other holder is on a real server's clock
				}
			}
		})
	}
	for i := range keys {
		work <- i
	}
	close(work)
	wg.Wait()
}

// listTargeter hands out each target once, then ends the attack.
func listTargeter(targets []vegeta.Target) vegeta.Targeter {
	var mu sync.Mutex
	i := 0
	return func(tgt *vegeta.Target) error {
		mu.Lock()
		defer mu.Unlock()
		if i == len(targets) {
			return vegeta.ErrNoTargets
		}
		*tgt = targets[i]
		i++
		return nil
	}
}
