package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/internal/testenv"
)

// TestEndToEndStorm: cmd/celeriant-sim (or the real server at CELERIANT_ADDR) and two
// nethttp processes sharing one Postgres store (and projection) and that log, driven
// by vegeta.
//
// Phase 1: 5,000 deposits over 500 keys, every key sent 10 times, 5 to each
// replica, the copies of a key concurrently; no answer may be a 5xx or a transport
// error. Phase 2: 1,000 deposits over 100 more keys, and replica 2 is killed with
// SIGKILL a third of the way in; only requests to the dead replica may fail. Then
// every key is retried on replica 1 until answered 200. From the event log: each
// key wrote exactly one event, and each account's balance is the sum of its
// distinct deposits.
func TestEndToEndStorm(t *testing.T) {
	const (
		keys1, keys2 = 500, 100
		keys         = keys1 + keys2
		copies       = 10 // per key, alternating replicas
		nAccount     = 20 // keys spread over accounts: concurrent writes to one aggregate
		scope        = "e2e"
	)
	dbURL := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	sfx := apptest.RandomSuffix()
	table, prefix := "idem_e2e_"+sfx, "e2e_"+sfx+"_"
	t.Cleanup(func() { apptest.DropTables(t, dbURL, table, prefix) })

	logAddr := os.Getenv("CELERIANT_ADDR") // a real server; else the simulator's process
	if logAddr == "" {
		logAddr = proctest.Start(t, proctest.Build(t, "../../cmd/celeriant-sim", "celeriant-sim"), "ADDR=127.0.0.1:0").Addr
	}
	server := proctest.Build(t, ".", "nethttp")
	// A short lease, so the keys the killed replica held are taken over quickly.
	env := []string{"ADDR=127.0.0.1:0", "IDEM_STORE=postgres", "DATABASE_URL=" + dbURL, "IDEM_TABLE=" + table,
		"PROJECTION=postgres", "ACCOUNTS_TABLE_PREFIX=" + prefix, "CELERIANT_ADDR=" + logAddr, "IDEM_LEASE=2s"}
	replicas := []*proctest.Proc{proctest.Start(t, server, env...), proctest.Start(t, server, env...)}

	accts := make([]uuid.UUID, nAccount)
	for i := range accts {
		accts[i] = uuid.New()
	}
	keyName := func(i int) string { return fmt.Sprintf("dep-%03d", i) }
	amount := func(i int) int64 { return int64(100 + i) } // distinct per key
	target := func(i, replica int) vegeta.Target {
		return vegeta.Target{
			Method: "POST",
			URL:    replicas[replica].URL + "/api/accounts/" + accts[i%nAccount].String() + "/deposit",
			Body:   fmt.Appendf(nil, `{"amountCents":%d}`, amount(i)),
			Header: http.Header{"Idempotency-Key": {keyName(i)}, "X-Client-Id": {scope}, "Content-Type": {"application/json"}},
		}
	}
	// Copies of a key are adjacent, so the workers send them at the same time.
	targets := func(from, to int) []vegeta.Target {
		var out []vegeta.Target
		for i := from; i < to; i++ {
			for c := range copies {
				out = append(out, target(i, c%2))
			}
		}
		return out
	}

	st := storm(t, targets(0, keys1), replicas, 0)
	t.Logf("phase 1: %s", st)
	if st.executed > keys1 {
		t.Errorf("%d executions answered for %d keys: a key ran twice", st.executed, keys1)
	}
	st = storm(t, targets(keys1, keys), replicas, copies*keys2/3)
	t.Logf("phase 2, replica 2 killed after %d answers: %s", copies*keys2/3, st)

	// A client retries a key until it gets its answer: keys whose copies all met a
	// 409, or whose holder died. Every key must then be answered 200 by replica 1.
	settle(t, keys, func(i int) vegeta.Target { return target(i, 0) })

	// The event log decides.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := celeriant.Dial(ctx, logAddr)
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
		r := apptest.Do(t, "GET", replicas[0].URL+"/api/accounts/"+acct.String()+"/balance", "", "", "")
		if !strings.Contains(r.Body, fmt.Sprintf(`"balanceCents":%d,`, want)) {
			t.Errorf("replica 1 says %s for %s, want balance %d", r.Body, acct, want)
		}
	}
	total := 0
	for i := range keys {
		n := seen[accounts.EventIDFor(scope, keyName(i), accounts.Operation("deposit", int32(amount(i)), accts[i%nAccount]))]
		total += n
		if n != 1 {
			t.Errorf("key %s: %d events in the log, want exactly 1", keyName(i), n)
		}
	}
	if len(seen) != keys || total != keys {
		t.Errorf("log holds %d distinct event ids, %d events of our keys; want %d and %d", len(seen), total, keys, keys)
	}
}

// stormStats summarises one attack.
type stormStats struct {
	metrics          vegeta.Metrics
	statuses         map[uint16]int
	executed         int // 200s that were not replays
	inFlight, gaveUp int // 409s: key held by a copy; write loop out of attempts
	downErrors       int // failed requests to the killed replica
}

func (s stormStats) String() string {
	m := &s.metrics
	return fmt.Sprintf("%d requests over 2 replicas in %v: %.0f req/s, p50 %v, p90 %v, p99 %v, max %v; statuses %v "+
		"(409: %d in flight, %d write loop gave up; %d failed on the killed replica); %d executions",
		m.Requests, m.Duration.Round(time.Millisecond), m.Rate, m.Latencies.P50.Round(time.Microsecond),
		m.Latencies.P90.Round(time.Microsecond), m.Latencies.P99.Round(time.Microsecond), m.Latencies.Max.Round(time.Microsecond),
		s.statuses, s.inFlight, s.gaveUp, s.downErrors, s.executed)
}

// storm sends targets with 64 workers. With killAfter > 0 it kills replica 2 after
// that many answers; from then on, failures of requests to it are counted, not
// errors. Any other 5xx or transport error fails the test.
func storm(t *testing.T, targets []vegeta.Target, replicas []*proctest.Proc, killAfter int) stormStats {
	t.Helper()
	attacker := vegeta.NewAttacker(vegeta.Workers(64), vegeta.MaxWorkers(64), vegeta.Connections(64), vegeta.Timeout(30*time.Second))
	st := stormStats{statuses: map[uint16]int{}}
	n := 0
	for res := range attacker.Attack(proctest.ListTargeter(targets), vegeta.Rate{}, 2*time.Minute, "e2e") {
		if res.Code == 0 && res.Error == vegeta.ErrNoTargets.Error() {
			continue // a worker found the list exhausted; nothing was sent
		}
		if n++; n == killAfter {
			replicas[1].Kill()
		}
		st.metrics.Add(res)
		st.statuses[res.Code]++
		down := replicas[1].Killed() && strings.HasPrefix(res.URL, replicas[1].URL+"/")
		switch {
		case (res.Code == 0 || res.Code >= 500) && down:
			st.downErrors++
		case res.Code == 0:
			t.Errorf("transport error: %s", res.Error)
		case res.Code >= 500:
			t.Errorf("5xx answer %d from %s: %.300s", res.Code, res.URL, res.Body)
		case res.Code == http.StatusOK:
			if res.Headers.Get("Idempotent-Replayed") == "" {
				st.executed++
			}
		case res.Code == http.StatusConflict: // in flight, or the write loop gave up: retry
			if strings.Contains(string(res.Body), `"code":"request_in_flight"`) {
				st.inFlight++
			} else {
				st.gaveUp++
			}
		default:
			t.Errorf("unexpected answer %d: %.300s", res.Code, res.Body)
		}
	}
	st.metrics.Close()
	if st.metrics.Requests != uint64(len(targets)) {
		t.Fatalf("sent %d requests, want %d", st.metrics.Requests, len(targets))
	}
	return st
}

// settle sends every key once more, retrying 409s (a key a dead replica held is
// free once its lease ends), until each is answered 200.
func settle(t *testing.T, keys int, target func(i int) vegeta.Target) {
	t.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	httpc := &http.Client{Timeout: 30 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				tg := target(i)
				for {
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
					if resp.StatusCode != http.StatusConflict || time.Now().After(deadline) {
						t.Errorf("settling key %d: %d %s", i, resp.StatusCode, body)
						break
					}
					time.Sleep(50 * time.Millisecond) // the holder's lease runs on the database's clock
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
