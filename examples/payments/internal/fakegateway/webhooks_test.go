package fakegateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestWebhooksAtLeastOnce: every event (a charge's capture, its refund; a
// second refund emits nothing) reaches the receiver Deliveries times, signed
// with the secret, each copy retried until it is answered 2xx.
func TestWebhooksAtLeastOnce(t *testing.T) {
	var (
		mu       sync.Mutex
		received = map[string]int{} // event id -> 2xx answers
		failed   = map[string]bool{}
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sig := r.Header.Get(SignatureHeader)
		ts := strings.TrimPrefix(strings.Split(sig, ",")[0], "t=")
		var ev Event
		_ = json.Unmarshal(body, &ev)
		var sec int64
		for _, c := range ts {
			sec = sec*10 + int64(c-'0')
		}
		if Sign([]byte("s3cret"), time.Unix(sec, 0), body) != sig {
			t.Errorf("bad signature %q", sig)
		}
		mu.Lock()
		defer mu.Unlock()
		if !failed[ev.ID] { // the first copy of each event fails once
			failed[ev.ID] = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		received[ev.ID+" "+ev.Type]++
	}))
	defer recv.Close()
	g := New(Faults{}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := g.StartWebhooks(ctx, Webhooks{URL: recv.URL, Secret: "s3cret", Deliveries: 3, Shuffle: true}); err != nil {
		t.Fatal(err)
	}
	c, _, _ := g.chargeOnce("k", ChargeRequest{AmountCents: 5, Currency: "EUR"})
	if _, refunded, ok := g.Refund(c.ID); !refunded || !ok {
		t.Fatal("first refund refused")
	}
	if _, refunded, ok := g.Refund(c.ID); refunded || !ok {
		t.Fatal("second refund refunded again")
	}
	deadline := time.Now().Add(5 * time.Minute) // a bound for a hang; a busy machine only slows this down
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-10 * time.Second)
	}
	for s := g.WebhookStats(); s.Pending > 0; s = g.WebhookStats() {
		if time.Now().After(deadline) {
			t.Fatalf("not delivered: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	evs := g.Events()
	if s := g.WebhookStats(); len(evs) != 2 || s.Delivered != 6 || s.Attempts != 8 || s.GaveUp != 0 {
		t.Fatalf("events %+v, stats %+v; want 2 events, 6 delivered in 8 attempts", evs, s)
	}
	mu.Lock()
	defer mu.Unlock()
	if received[evs[0].ID+" "+EventChargeSucceeded] != 3 || received[evs[1].ID+" "+EventChargeRefunded] != 3 || !evs[1].Data.Refunded {
		t.Fatalf("received %v for events %+v; want each 3 times", received, evs)
	}
}

func TestWebhooksFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	w, err := WebhooksFromEnv(env("GATEWAY_WEBHOOK_URL", "http://127.0.0.1:8080/webhooks", "GATEWAY_WEBHOOK_SECRET", "s",
		"GATEWAY_WEBHOOK_DELIVERIES", "3", "GATEWAY_WEBHOOK_SHUFFLE", "1"))
	if err != nil || w.Deliveries != 3 || !w.Shuffle || w.Secret != "s" {
		t.Fatalf("%+v %v", w, err)
	}
	if w, err := WebhooksFromEnv(env()); err != nil || w.URL != "" || w.Deliveries != 1 {
		t.Fatalf("empty env: %+v %v", w, err)
	}
	for _, bad := range [][]string{
		{"GATEWAY_WEBHOOK_URL", "http://x/"}, // no secret
		{"GATEWAY_WEBHOOK_URL", "ftp://x/", "GATEWAY_WEBHOOK_SECRET", "s"},
		{"GATEWAY_WEBHOOK_DELIVERIES", "0"},
		{"GATEWAY_WEBHOOK_SHUFFLE", "maybe"},
	} {
		if _, err := WebhooksFromEnv(env(bad...)); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}

// TestRefundAndEventRoutes: POST /charges/{id}/refund refunds once (a second
// call answers the same charge, marked replayed), 404 for an unknown charge;
// GET /events lists the capture and the refund; GET /webhooks counts them.
func TestRefundAndEventRoutes(t *testing.T) {
	g := New(Faults{}, nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	c, _, _ := g.chargeOnce("k", ChargeRequest{AmountCents: 7, Currency: "EUR"})
	get := func(method, path string) (int, string, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
	}
	for i, want := range []string{"", "true"} {
		status, replayed, body := get(http.MethodPost, "/charges/"+c.ID+"/refund")
		var got Charge
		_ = json.Unmarshal([]byte(body), &got)
		if status != http.StatusOK || replayed != want || !got.Refunded || got.ID != c.ID {
			t.Fatalf("refund %d: %d replayed=%q %s", i, status, replayed, body)
		}
	}
	if status, _, body := get(http.MethodPost, "/charges/ch_nope/refund"); status != http.StatusNotFound {
		t.Fatalf("unknown charge: %d %s", status, body)
	}
	var evs []Event
	_, _, body := get(http.MethodGet, "/events")
	if err := json.Unmarshal([]byte(body), &evs); err != nil || len(evs) != 2 || evs[0].Type != EventChargeSucceeded ||
		evs[1].Type != EventChargeRefunded || evs[0].ID == evs[1].ID || evs[1].Data.ID != c.ID {
		t.Fatalf("events: %s (%v)", body, err)
	}
	if _, _, body := get(http.MethodGet, "/webhooks"); !strings.Contains(body, `"events":2`) {
		t.Fatalf("webhooks: %s", body)
	}
}
