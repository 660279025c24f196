package apptest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/internal/accountsapp"
)

// RunWatch checks a server's GET /api/watch/stream (docs/account-service.md section
// 1.6) on embedded defaults: the SSE headers a proxy needs, passed through by the
// idempotency middleware even with an Idempotency-Key, and an unnamed data event with
// the reference's payload for a deposit, flushed without waiting for more.
func RunWatch(t *testing.T, wire accountsapp.Wire) {
	s := Start(t, wire, map[string]string{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/api/watch/stream", nil)
	req.Header.Set("Idempotency-Key", `"ignored-on-a-get"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); resp.StatusCode != 200 || got != want {
			t.Fatalf("stream: %d, %s %q, want 200 and %q", resp.StatusCode, k, got, want)
		}
	}
	dep := Do(t, "POST", s.URL+"/api/accounts/"+accounts.AliceID.String()+"/deposit", `"watch-dep"`, "", `{"amountCents":100}`)
	if dep.Status != 200 {
		t.Fatalf("deposit: %d %s", dep.Status, dep.Body)
	}
	var res struct{ AggregateVersion uint64 }
	_ = json.Unmarshal([]byte(dep.Body), &res)
	want := `data: {"aggregateId":"` + accounts.AliceID.String() + `","operation":"Write","toAggregateVersion":`
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before the deposit's event: %v", err)
		}
		if strings.HasPrefix(line, "event:") {
			t.Fatalf("named event %q: the reference's page listens to unnamed ones", line)
		}
		if strings.HasPrefix(line, want) {
			var ev struct{ ToAggregateVersion uint64 }
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev)
			if ev.ToAggregateVersion != res.AggregateVersion {
				t.Fatalf("event %q, want version %d", line, res.AggregateVersion)
			}
			return
		}
	}
}
