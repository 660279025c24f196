package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/internal/testenv"
)

// TestWatchAcrossReplicas: two nethttp processes share one cmd/celeriant-sim; a
// browser's stream on replica 2 (GET /api/watch/stream, with an Idempotency-Key the
// middleware must ignore on a GET) carries an unnamed data event with the
// reference's payload for a deposit made through replica 1, with each projection.
func TestWatchAcrossReplicas(t *testing.T) {
	projections := map[string][]string{"memory": {"PROJECTION=memory"}}
	if url := os.Getenv("DATABASE_URL"); url != "" {
		sfx := apptest.RandomSuffix()
		table, prefix := "idem_watch_"+sfx, "watch_"+sfx+"_"
		t.Cleanup(func() { apptest.DropTables(t, url, table, prefix) })
		projections["postgres"] = []string{"PROJECTION=postgres", "IDEM_STORE=postgres", "DATABASE_URL=" + url,
			"IDEM_TABLE=" + table, "ACCOUNTS_TABLE_PREFIX=" + prefix}
	} else if testenv.CI() {
		t.Fatal("CI=true but DATABASE_URL is not set")
	} else {
		t.Log("DATABASE_URL not set: the Postgres projection is skipped")
	}
	server := proctest.Build(t, ".", "nethttp")
	simBin := proctest.Build(t, "../../cmd/celeriant-sim", "celeriant-sim")
	for name, env := range projections {
		t.Run(name, func(t *testing.T) {
			sim := proctest.Start(t, simBin, "ADDR=127.0.0.1:0")
			env := append([]string{"ADDR=127.0.0.1:0", "CELERIANT_ADDR=" + sim.Addr}, env...)
			r1, r2 := proctest.Start(t, server, env...), proctest.Start(t, server, env...)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", r2.URL+"/api/watch/stream", nil)
			req.Header.Set("Idempotency-Key", `"not-for-a-get"`)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
				resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("X-Accel-Buffering") != "no" {
				t.Fatalf("stream answer %d %v", resp.StatusCode, resp.Header)
			}
			r := bufio.NewReader(resp.Body)

			dep := apptest.Do(t, "POST", r1.URL+"/api/accounts/"+accounts.BobID.String()+"/deposit", `"watch-1"`, "", `{"amountCents":700}`)
			if dep.Status != 200 {
				t.Fatalf("deposit on replica 1: %d %s", dep.Status, dep.Body)
			}
			var res struct{ AggregateVersion uint64 }
			_ = json.Unmarshal([]byte(dep.Body), &res)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("stream of replica 2 ended before the deposit arrived: %v", err)
				}
				data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
				if !ok {
					if strings.HasPrefix(line, "event:") {
						t.Fatalf("a named event %q: the reference's page listens to unnamed ones", line)
					}
					continue
				}
				var ev struct {
					AggregateID        string `json:"aggregateId"`
					Operation          string `json:"operation"`
					ToAggregateVersion uint64 `json:"toAggregateVersion"`
				}
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatalf("data %q: %v", data, err)
				}
				if ev.AggregateID == accounts.BobID.String() && ev.Operation == "Write" && ev.ToAggregateVersion == res.AggregateVersion {
					return
				}
				t.Logf("other event: %s", data)
			}
		})
	}
}
