package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// TestPaymentsAPI walks the API in-process on real Postgres: authentication
// before the middleware, a charge and its replay, the key reused for another
// body, validation errors replayed, GET by id per principal, and keys scoped
// by principal.
func TestPaymentsAPI(t *testing.T) {
	ts := newTestServer(t, map[string]string{"PAYMENTS_TOKENS": "demo=merchant-demo,other=merchant-other"})

	var recordCount = func() int {
		var n int
		if err := ts.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+ts.prefix+`idemkey_records"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, auth := range []string{"", "Bearer nope", "Basic demo", "Bearer"} {
		a := mustDo(t, http.MethodPost, ts.URL+"/payments", payBody, "Authorization", auth, "Idempotency-Key", "k1")
		if a.Status != http.StatusUnauthorized || a.problemCode() != codeUnauthorized || a.problemType() != problemTypePrefix+codeUnauthorized ||
			a.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("Authorization %q: %d %s, want 401 unauthorized with WWW-Authenticate", auth, a.Status, a.Body)
		}
	}
	if n := recordCount(); n != 0 {
		t.Fatalf("%d idempotency records after refused requests, want none", n)
	}

	first := pay(t, ts.URL, "k1", payBody)
	p := first.payment(t)
	if first.Status != http.StatusCreated || first.Replayed || first.Header.Get("Location") != "/payments/"+p.ID ||
		p.Status != "succeeded" || p.AmountCents != 1250 || p.Currency != "EUR" || p.CustomerID != "cust-1" || !strings.HasPrefix(p.ProviderChargeID, "ch_") {
		t.Fatalf("first: %d %v %s", first.Status, first.Header, first.Body)
	}
	charges := ts.gateway.Charges()
	if len(charges) != 1 || charges[0].ID != p.ProviderChargeID || charges[0].IdempotencyKey != "merchant-demo:k1" {
		t.Fatalf("charges %+v, want one under merchant-demo:k1", charges)
	}

	again := pay(t, ts.URL, "k1", payBody)
	if again.Status != http.StatusCreated || !again.Replayed || again.Body != first.Body || again.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatalf("retry: %d replayed=%v %s, want the first answer replayed", again.Status, again.Replayed, again.Body)
	}
	if a := pay(t, ts.URL, "k1", `{"amountCents":9900,"currency":"EUR","customerId":"cust-1"}`); a.Status != http.StatusUnprocessableEntity ||
		a.problemType() != "urn:idemkey:problem:key_reused_with_different_payload" {
		t.Fatalf("other body: %d %s, want 422 key_reused_with_different_payload", a.Status, a.Body)
	}

	bad := pay(t, ts.URL, "k2", `{"amountCents":0,"currency":"EUR","customerId":"cust-1"}`)
	if bad.Status != http.StatusUnprocessableEntity || bad.problemCode() != codeValidation || bad.problemType() != problemTypePrefix+codeValidation || bad.Replayed {
		t.Fatalf("invalid: %d %s", bad.Status, bad.Body)
	}
	if a := pay(t, ts.URL, "k2", `{"amountCents":0,"currency":"EUR","customerId":"cust-1"}`); a.Status != bad.Status || a.Body != bad.Body || !a.Replayed {
		t.Fatalf("invalid again: %d replayed=%v %s, want the 422 replayed", a.Status, a.Replayed, a.Body)
	}
	if a := pay(t, ts.URL, "k3", `{"amountCents":`); a.Status != http.StatusBadRequest || a.problemCode() != codeMalformed {
		t.Fatalf("malformed: %d %s", a.Status, a.Body)
	}

	get := mustDo(t, http.MethodGet, ts.URL+"/payments/"+p.ID, "", "Authorization", "Bearer demo")
	if get.Status != http.StatusOK || get.payment(t) != p {
		t.Fatalf("GET: %d %s, want %+v", get.Status, get.Body, p)
	}
	// Every spelling uuid.Parse reads is the same id; none is a 503 (Postgres does not
	// read urn:uuid:).
	for _, id := range []string{"urn:uuid:" + p.ID, "{" + p.ID + "}", strings.ToUpper(p.ID), strings.ReplaceAll(p.ID, "-", "")} {
		if a := mustDo(t, http.MethodGet, ts.URL+"/payments/"+id, "", "Authorization", "Bearer demo"); a.Status != http.StatusOK || a.payment(t) != p {
			t.Errorf("GET /payments/%s: %d %s, want %+v", id, a.Status, a.Body, p)
		}
	}
	for _, tc := range []struct{ path, token string }{{"/payments/" + p.ID, "other"}, {"/payments/not-a-uuid", "demo"}, {"/payments/00000000-0000-0000-0000-000000000000", "demo"}} {
		if a := mustDo(t, http.MethodGet, ts.URL+tc.path, "", "Authorization", "Bearer "+tc.token); a.Status != http.StatusNotFound || a.problemCode() != codeNotFound {
			t.Errorf("GET %s as %s: %d %s, want 404", tc.path, tc.token, a.Status, a.Body)
		}
	}
	if a := mustDo(t, http.MethodGet, ts.URL+"/payments/"+p.ID, ""); a.Status != http.StatusUnauthorized {
		t.Errorf("GET without a token: %d", a.Status)
	}

	// The other principal's "k1" is its own payment.
	theirs := mustDo(t, http.MethodPost, ts.URL+"/payments", payBody, "Authorization", "Bearer other", "Idempotency-Key", "k1")
	if theirs.Status != http.StatusCreated || theirs.Replayed || theirs.payment(t).ID == p.ID {
		t.Fatalf("other principal, same key: %d replayed=%v %s, want a payment of its own", theirs.Status, theirs.Replayed, theirs.Body)
	}
	if n, rows := len(ts.gateway.Charges()), ts.rows(t); n != 2 || rows != 2 {
		t.Fatalf("%d charges, %d rows; want 2 and 2", n, rows)
	}

	page := mustDo(t, http.MethodGet, ts.URL+"/", "")
	if page.Status != http.StatusOK || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") || !strings.Contains(page.Body, "crypto.randomUUID()") {
		t.Fatalf("GET /: %d %s", page.Status, page.Header)
	}
	if a := mustDo(t, http.MethodGet, ts.URL+"/nothing", ""); a.Status != http.StatusNotFound || a.problemCode() != codeNotFound {
		t.Fatalf("GET /nothing: %d %s", a.Status, a.Body)
	}
}

// TestGatewayFailureReleasesTheKey: when the provider fails (503) or its answer
// is lost after charging, the payment answers 503 gateway_unavailable with
// Retry-After and keeps nothing; the retry with the same key runs, and the
// provider's key deduplication leaves one charge.
func TestGatewayFailureReleasesTheKey(t *testing.T) {
	for _, tc := range []struct {
		name, faults string
		charged      int // charges after the failed attempt
	}{
		{"gateway 503", "fail=1", 0},
		{"answer lost after charging", "loseFirst=1", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestServer(t, nil)
			faulty := ts.start(t, nil, ts.gwURL+"/?"+tc.faults)
			a := pay(t, faulty, "k", payBody)
			if a.Status != http.StatusServiceUnavailable || a.problemCode() != codeGatewayUnavailable || a.Header.Get("Retry-After") != "1" {
				t.Fatalf("%d %v %s, want 503 gateway_unavailable, Retry-After: 1", a.Status, a.Header, a.Body)
			}
			if n, rows := len(ts.gateway.Charges()), ts.rows(t); n != tc.charged || rows != 0 {
				t.Fatalf("after the failure: %d charges, %d rows; want %d, 0", n, rows, tc.charged)
			}
			retry := pay(t, ts.URL, "k", payBody)
			if retry.Status != http.StatusCreated || retry.Replayed {
				t.Fatalf("retry: %d replayed=%v %s, want a fresh 201", retry.Status, retry.Replayed, retry.Body)
			}
			charges := ts.gateway.Charges()
			if len(charges) != 1 || ts.rows(t) != 1 || retry.payment(t).ProviderChargeID != charges[0].ID {
				t.Fatalf("%+v, %d rows; want one charge, the payment's, and one row", charges, ts.rows(t))
			}
		})
	}
}

// TestFaultHeader: X-Fault is ignored unless PAYMENTS_FAULTS=1; an unknown value
// is a 400 before the middleware, so the key stays new.
func TestFaultHeader(t *testing.T) {
	ts := newTestServer(t, nil)
	if a := pay(t, ts.URL, "k1", payBody, "X-Fault", "crash-after-commit"); a.Status != http.StatusCreated {
		t.Fatalf("faults off: %d %s, want the header ignored", a.Status, a.Body)
	}
	withFaults := ts.start(t, map[string]string{"PAYMENTS_FAULTS": "1"}, ts.gwURL)
	a := pay(t, withFaults, "k2", payBody, "X-Fault", "explode")
	if a.Status != http.StatusBadRequest || a.problemCode() != codeBadFault {
		t.Fatalf("unknown fault: %d %s, want 400 bad_fault", a.Status, a.Body)
	}
	if a := pay(t, withFaults, "k2", payBody, "X-Fault", "slow=1ms"); a.Status != http.StatusCreated || a.Replayed {
		t.Fatalf("after the refused fault: %d replayed=%v %s, want the key still new", a.Status, a.Replayed, a.Body)
	}
}

// TestNaturalKeySafetyNet: when a payment's idempotency record is gone (expired
// and swept) and the client retries, the handler runs again, the provider's key
// deduplication answers the first charge, and the unique charge id finds the
// existing row: the same payment, still one row.
func TestNaturalKeySafetyNet(t *testing.T) {
	ts := newTestServer(t, nil)
	first := pay(t, ts.URL, "k1", payBody)
	if first.Status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	if _, err := ts.pool.Exec(context.Background(), `DELETE FROM "`+ts.prefix+`idemkey_records"`); err != nil {
		t.Fatal(err)
	}
	again := pay(t, ts.URL, "k1", payBody)
	if again.Status != http.StatusCreated || again.Replayed || again.payment(t) != first.payment(t) {
		t.Fatalf("retry without the record: %d replayed=%v %s, want the first payment, not replayed", again.Status, again.Replayed, again.Body)
	}
	if n, rows := len(ts.gateway.Charges()), ts.rows(t); n != 1 || rows != 1 {
		t.Fatalf("%d charges, %d rows; want 1 and 1", n, rows)
	}
}
