package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemkey/idemkey/examples/internal/proctest"
)

// TestRetryStorm drives the fixture, as a separate process over TCP, with 200
// distinct keys each sent 5 times concurrently plus 40 concurrent copies of one
// slow request: every handler runs once per key, every answer is the original, a
// marked replay or a 409, and nothing is a 5xx.
func TestRetryStorm(t *testing.T) {
	const keys, copies, slowCopies = 200, 5, 40
	base := proctest.Start(t, proctest.Build(t, ".", "conformance"), "ADDR=127.0.0.1:0").URL

	hdr := func(key string) http.Header {
		return http.Header{"Idempotency-Key": {key}, "Content-Type": {"text/plain"}, "X-Client-Id": {"storm"}}
	}
	var targets []vegeta.Target
	for range slowCopies {
		targets = append(targets, vegeta.Target{Method: "POST", URL: base + "/slow?ms=400", Header: hdr("storm-slow"), Body: []byte("slow")})
	}
	for k := range keys {
		for range copies {
			targets = append(targets, vegeta.Target{Method: "POST", URL: base + "/echo", Header: hdr(fmt.Sprint("storm-", k)), Body: fmt.Appendf(nil, "body-%d", k)})
		}
	}
	attacker := vegeta.NewAttacker(vegeta.Workers(64), vegeta.MaxWorkers(64), vegeta.Timeout(30*time.Second))
	originals := map[string]int{}
	statuses := map[uint16]int{}
	var metrics vegeta.Metrics
	for res := range attacker.Attack(proctest.ListTargeter(targets), vegeta.Rate{}, time.Minute, "storm") {
		if res.Code == 0 && res.Error == vegeta.ErrNoTargets.Error() {
			continue // a worker found the list exhausted; nothing was sent
		}
		metrics.Add(res)
		statuses[res.Code]++
		switch {
		case res.Code == 0: // vegeta sets Error for every non-2xx too; only code 0 is a transport failure
			t.Errorf("transport error: %s", res.Error)
		case res.Code >= 500:
			t.Errorf("5xx answer %d: %.200q", res.Code, res.Body)
		case res.Code == http.StatusConflict:
			if !strings.HasPrefix(res.Headers.Get("Content-Type"), "application/problem+json") {
				t.Errorf("409 without problem details: %v", res.Headers)
			}
		case res.Code == http.StatusOK && strings.HasSuffix(res.URL, "/slow?ms=400"):
			if string(res.Body) != "slept:400" {
				t.Errorf("slow answer %q", res.Body)
			}
			if res.Headers.Get("Idempotent-Replayed") == "" {
				originals["storm-slow"]++
			}
		case res.Code == http.StatusCreated:
			body := string(res.Body)
			if !strings.HasPrefix(body, "body-") {
				t.Errorf("unexpected echo body %q", body)
				continue
			}
			if res.Headers.Get("Idempotent-Replayed") == "" {
				originals[body]++
			} else if res.Headers.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay marker %q", res.Headers.Get("Idempotent-Replayed"))
			}
		default:
			t.Errorf("unexpected answer %d %.200q", res.Code, res.Body)
		}
	}
	metrics.Close()
	if metrics.Requests != uint64(len(targets)) {
		t.Fatalf("sent %d requests, want %d", metrics.Requests, len(targets))
	}
	if len(originals) != keys+1 {
		t.Errorf("%d keys answered by an execution, want %d", len(originals), keys+1)
	}
	for k, n := range originals {
		if n != 1 {
			t.Errorf("%s answered unmarked by %d executions", k, n)
		}
	}
	resp, err := http.Get(base + "/counter")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct{ Count int }
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Count != keys+1 {
		t.Errorf("handler ran %d times, want %d (one per distinct key)", got.Count, keys+1)
	}
	t.Logf("%d requests in %v: statuses %v, p50 %v p99 %v", metrics.Requests, metrics.Duration, statuses, metrics.Latencies.P50, metrics.Latencies.P99)
}
