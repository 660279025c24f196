package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

const testWebhookSecret = "whsec_test"

// TestVerifySignature: of generated deliveries, only those signed with the
// secret over exactly the body, with a timestamp within the tolerance, pass.
func TestVerifySignature(t *testing.T) {
	secret := []byte(testWebhookSecret)
	now := time.Unix(1_800_000_000, 0)
	const tol = 5 * time.Minute
	for i := range 200 {
		body := fmt.Appendf(nil, `{"id":"evt_%d","type":"charge.succeeded","data":{"id":"ch_%d"}}`, i, rand.Uint64())
		good := fakegateway.Sign(secret, now.Add(time.Duration(rand.Int64N(int64(2*tol)))-tol), body)
		if err := verifySignature(secret, good, body, now, tol); err != nil {
			t.Fatalf("a good signature %q refused: %v", good, err)
		}
		if err := verifySignature(secret, "v1="+strings.Repeat("00", 32)+","+good+",v1="+strings.Repeat("ab", 32), body, now, tol); err != nil {
			t.Fatalf("a good signature among others refused: %v", err)
		}
		flipped := bytes.Clone(body)
		flipped[rand.IntN(len(flipped))] ^= byte(1 + rand.IntN(255))
		stale := now.Add(tol + time.Second + time.Duration(rand.Int64N(int64(time.Hour))))
		for name, c := range map[string]struct {
			header string
			body   []byte
			want   error
		}{
			"body changed":    {good, flipped, errWrongSignature},
			"other secret":    {fakegateway.Sign([]byte("whsec_other"), now, body), body, errWrongSignature},
			"too old":         {fakegateway.Sign(secret, now.Add(-(stale.Sub(now))), body), body, errStaleSignature},
			"in the future":   {fakegateway.Sign(secret, stale, body), body, errStaleSignature},
			"missing":         {"", body, errNoSignature},
			"no v1":           {strings.Split(good, ",")[0], body, errBadSignature},
			"no t":            {strings.Split(good, ",")[1], body, errBadSignature},
			"short v1":        {good[:len(good)-2], body, errBadSignature},
			"not hex":         {good[:len(good)-1] + "z", body, errBadSignature},
			"timestamp moved": {strings.Replace(good, "t=1", "t=2", 1), body, errStaleSignature},
			// The MAC binds the timestamp: a fresh t beside an old signature,
			// or a second t after the signed one, matches nothing.
			"timestamp shifted": {strings.Replace(fakegateway.Sign(secret, now, body), "t=1800000000,", "t=1800000001,", 1), body, errWrongSignature},
			"second t":          {fakegateway.Sign(secret, now.Add(-tol-time.Hour), body) + ",t=" + fmt.Sprint(now.Unix()), body, errWrongSignature},
			"no equals":         {"garbage", body, errBadSignature},
		} {
			if err := verifySignature(secret, c.header, c.body, now, tol); err != c.want {
				t.Fatalf("%s (%q): %v, want %v", name, c.header, err, c.want)
			}
		}
	}
}

// signedPost delivers ev to base's /webhooks as the gateway does.
func signedPost(t *testing.T, base string, ev fakegateway.Event, secret string) answer {
	t.Helper()
	body, _ := json.Marshal(ev)
	return mustDo(t, http.MethodPost, base+"/webhooks", string(body), fakegateway.SignatureHeader, fakegateway.Sign([]byte(secret), time.Now(), body))
}

// transitions returns the number of logged transitions per "payment id:to state".
func (ts *testServer) transitions(t testing.TB) map[string]int {
	t.Helper()
	rows, err := ts.pool.Query(context.Background(), `SELECT payment_id::text, from_state, to_state FROM `+ts.payments.transitions)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id, from, to string
		if err := rows.Scan(&id, &from, &to); err != nil {
			t.Fatal(err)
		}
		out[id+":"+from+">"+to]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWebhookTransitions walks one payment's events by hand: a refund before its
// capture is answered 409 event_too_early and changes nothing (not even the
// inbox: its redelivery applies later); the capture applies, then the refund;
// every duplicate is a 200 that changes nothing; a bad signature is a 400; a
// capture after the refund changes nothing.
func TestWebhookTransitions(t *testing.T) {
	ts := newTestServer(t, map[string]string{"PAYMENTS_WEBHOOK_SECRET": testWebhookSecret})
	p := pay(t, ts.URL, "wh-1", payBody).payment(t)
	if p.State != stateAuthorized {
		t.Fatalf("a new payment is %q, want authorized", p.State)
	}
	ch := ts.gateway.Charges()[0]
	capture := fakegateway.Event{ID: "evt_capture", Type: fakegateway.EventChargeSucceeded, Data: ch}
	refund := fakegateway.Event{ID: "evt_refund", Type: fakegateway.EventChargeRefunded, Data: ch}
	state := func() string {
		got, err := ts.payments.get(context.Background(), "merchant-demo", p.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.State
	}
	steps := []struct {
		ev      fakegateway.Event
		secret  string
		status  int
		outcome string // of a 200
		state   string
	}{
		{refund, testWebhookSecret, http.StatusConflict, "", stateAuthorized},
		{refund, "whsec_forged", http.StatusBadRequest, "", stateAuthorized},
		{capture, "whsec_forged", http.StatusBadRequest, "", stateAuthorized},
		{capture, testWebhookSecret, http.StatusOK, "applied", stateCaptured},
		{capture, testWebhookSecret, http.StatusOK, "already_processed", stateCaptured},
		{refund, testWebhookSecret, http.StatusOK, "applied", stateRefunded},
		{refund, testWebhookSecret, http.StatusOK, "already_processed", stateRefunded},
		{fakegateway.Event{ID: "evt_capture_2", Type: fakegateway.EventChargeSucceeded, Data: ch}, testWebhookSecret, http.StatusOK, "applied", stateRefunded},
		{fakegateway.Event{ID: "evt_unknown", Type: fakegateway.EventChargeSucceeded, Data: fakegateway.Charge{ID: "ch_unknown"}}, testWebhookSecret, http.StatusConflict, "", stateRefunded},
	}
	for i, s := range steps {
		a := signedPost(t, ts.URL, s.ev, s.secret)
		var out struct{ Outcome string }
		_ = json.Unmarshal([]byte(a.Body), &out)
		if a.Status != s.status || (s.status == http.StatusOK && out.Outcome != s.outcome) || state() != s.state {
			t.Fatalf("step %d (%s %s): %d %s, state %s; want %d %s, state %s", i, s.ev.Type, s.ev.ID, a.Status, a.Body, state(), s.status, s.outcome, s.state)
		}
	}
	if got := ts.transitions(t); len(got) != 2 || got[p.ID+":authorized>captured"] != 1 || got[p.ID+":captured>refunded"] != 1 {
		t.Fatalf("transitions %v, want one capture and one refund", got)
	}
	if a := mustDo(t, http.MethodPost, ts.URL+"/webhooks", "{}"); a.Status != http.StatusBadRequest || a.problemCode() != codeBadSignature {
		t.Fatalf("unsigned: %d %s", a.Status, a.Body)
	}
	off := newTestServer(t, nil)
	if a := signedPost(t, off.URL, capture, testWebhookSecret); a.Status != http.StatusNotFound || a.problemCode() != codeWebhooksOff {
		t.Fatalf("without PAYMENTS_WEBHOOK_SECRET: %d %s, want 404 %s", a.Status, a.Body, codeWebhooksOff)
	}
}

// TestWebhooksAtLeastOnceOutOfOrder: the fake gateway delivers every event 3
// times, in random order, while 200 payments are made and half of them refunded
// right after their 201 (so refunds often come before their captures, and
// captures before their payment's row commits). Once every copy has been
// answered 2xx: every payment is captured, the refunded ones refunded, and the
// transitions log holds exactly one capture per payment and one refund per
// refunded payment.
func TestWebhooksAtLeastOnceOutOfOrder(t *testing.T) {
	const payments, deliveries = 200, 3
	ts := newTestServer(t, map[string]string{"PAYMENTS_WEBHOOK_SECRET": testWebhookSecret})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := ts.gateway.StartWebhooks(ctx, fakegateway.Webhooks{URL: ts.URL + "/webhooks", Secret: testWebhookSecret,
		Deliveries: deliveries, Shuffle: true}); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		refunded = map[string]bool{} // payment id -> refunded
	)
	payConcurrently(t, ts.URL, payments, "wh", func(i int, p Payment) {
		if i%2 == 0 {
			if _, ok, _ := ts.gateway.Refund(p.ProviderChargeID); !ok {
				t.Errorf("refund of %s: unknown charge", p.ProviderChargeID)
			}
		}
		mu.Lock()
		refunded[p.ID] = i%2 == 0
		mu.Unlock()
	})
	if t.Failed() {
		return
	}
	events := payments + payments/2
	waitFor(t, "every webhook copy answered 2xx", func() bool {
		s := ts.gateway.WebhookStats()
		return s.Events == events && s.Pending == 0
	})
	stats := ts.gateway.WebhookStats()
	if stats.Delivered != deliveries*events || stats.GaveUp != 0 {
		t.Fatalf("delivery stats %+v, want %d delivered, none given up", stats, deliveries*events)
	}
	tr := ts.transitions(t)
	total := 0
	for id, ref := range refunded {
		p, err := ts.payments.get(context.Background(), "merchant-demo", id)
		want := stateCaptured
		if ref {
			want = stateRefunded
		}
		if err != nil || p.State != want {
			t.Fatalf("payment %s: %q (%v), want %s", id, p.State, err, want)
		}
		if tr[id+":authorized>captured"] != 1 || (ref && tr[id+":captured>refunded"] != 1) {
			t.Fatalf("payment %s: transitions %d captures, %d refunds; want 1 and %v", id, tr[id+":authorized>captured"], tr[id+":captured>refunded"], ref)
		}
		total += tr[id+":authorized>captured"] + tr[id+":captured>refunded"]
	}
	if n := sum(tr); n != total || total != events {
		t.Fatalf("%d transitions logged, %d of the payments', want %d", n, total, events)
	}
	t.Logf("%d events, %d copies delivered in %d attempts (%d answered non-2xx: too early, redelivered)",
		events, stats.Delivered, stats.Attempts, stats.Attempts-stats.Delivered)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
