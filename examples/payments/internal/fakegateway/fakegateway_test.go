package fakegateway_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

// post sends POST /charges to srv with key (none when empty) and body.
func post(t *testing.T, url, key, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	// A fresh connection per call: net/http would re-send a keyed request once on a
	// kept-alive connection that closes without an answer, hiding a lost answer.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestChargeDeduplicatesByKey(t *testing.T) {
	g := fakegateway.New(fakegateway.Faults{}, nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	empty, err := http.Get(srv.URL + "/charges")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(empty.Body)
	empty.Body.Close()
	if empty.StatusCode != http.StatusOK || string(b) != "[]\n" {
		t.Fatalf("GET /charges before any charge: %d %q, want 200 []", empty.StatusCode, b)
	}
	const body = `{"amountCents":1250,"currency":"EUR","customerId":"ignored"}`

	resp, first, err := post(t, srv.URL+"/charges", "k1", body)
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first charge: %v %v %s", err, resp, first)
	}
	var c fakegateway.Charge
	if err := json.Unmarshal([]byte(first), &c); err != nil || !strings.HasPrefix(c.ID, "ch_") || c.IdempotencyKey != "k1" || c.AmountCents != 1250 || c.Currency != "EUR" {
		t.Fatalf("charge %+v (%v) from %s", c, err, first)
	}
	resp, again, err := post(t, srv.URL+"/charges", "k1", body)
	if err != nil || resp.StatusCode != http.StatusCreated || again != first || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same key again: %v %v %q, want the first answer %q, replayed", err, resp, again, first)
	}
	if resp, _, _ := post(t, srv.URL+"/charges", "k2", body); resp.StatusCode != http.StatusCreated {
		t.Fatalf("another key: %d", resp.StatusCode)
	}
	if got := g.Charges(); len(got) != 2 || got[0] != c || got[1].IdempotencyKey != "k2" || got[1].ID == c.ID {
		t.Fatalf("charges %+v, want k1's then k2's", got)
	}

	// GET /charges lists them, oldest first.
	r, err := http.Get(srv.URL + "/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var listed []fakegateway.Charge
	if err := json.NewDecoder(r.Body).Decode(&listed); err != nil || len(listed) != 2 || listed[0] != c {
		t.Fatalf("GET /charges: %v %+v", err, listed)
	}
}

func TestChargeRefusals(t *testing.T) {
	g := fakegateway.New(fakegateway.Faults{}, nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	if resp, _, _ := post(t, srv.URL+"/charges", "k", `{"amountCents":100,"currency":"EUR"}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("setup: %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		name, path, key, body string
		want                  int
	}{
		{"no key", "/charges", "", `{"amountCents":100,"currency":"EUR"}`, http.StatusBadRequest},
		{"not JSON", "/charges", "k2", `{`, http.StatusBadRequest},
		{"amount not a number", "/charges", "k2", `{"amountCents":"100","currency":"EUR"}`, http.StatusBadRequest},
		{"zero amount", "/charges", "k2", `{"amountCents":0,"currency":"EUR"}`, http.StatusUnprocessableEntity},
		{"key reused for another amount", "/charges", "k", `{"amountCents":200,"currency":"EUR"}`, http.StatusUnprocessableEntity},
		{"key reused for another currency", "/charges", "k", `{"amountCents":100,"currency":"USD"}`, http.StatusUnprocessableEntity},
		{"bad fault parameter", "/charges?fail=2", "k2", `{"amountCents":100,"currency":"EUR"}`, http.StatusBadRequest},
		{"other route", "/refunds", "k2", `{}`, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, err := post(t, srv.URL+tc.path, tc.key, tc.body)
			if err != nil || resp.StatusCode != tc.want || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%v %v %s, want %d problem+json", err, resp, body, tc.want)
			}
		})
	}
	if got := g.Charges(); len(got) != 1 {
		t.Fatalf("%d charges after refusals, want 1", len(got))
	}
}

func TestFaults(t *testing.T) {
	const body = `{"amountCents":100,"currency":"EUR"}`
	t.Run("fail: 503 and no charge", func(t *testing.T) {
		g := fakegateway.New(fakegateway.Faults{FailRate: 1}, nil)
		srv := httptest.NewServer(g)
		defer srv.Close()
		resp, _, err := post(t, srv.URL+"/charges", "k", body)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || len(g.Charges()) != 0 {
			t.Fatalf("%v %v, %d charges; want 503 and none", err, resp, len(g.Charges()))
		}
	})
	t.Run("lose: charged, no answer", func(t *testing.T) {
		g := fakegateway.New(fakegateway.Faults{LoseRate: 1}, nil)
		srv := httptest.NewServer(g)
		defer srv.Close()
		for range 2 {
			if _, _, err := post(t, srv.URL+"/charges", "k", body); err == nil {
				t.Fatal("an answer arrived; want the connection closed without one")
			}
		}
		if n := len(g.Charges()); n != 1 {
			t.Fatalf("%d charges, want 1", n)
		}
	})
	t.Run("loseFirst: the first answer per key is lost, then the charge is answered", func(t *testing.T) {
		g := fakegateway.New(fakegateway.Faults{LoseFirst: true}, nil)
		srv := httptest.NewServer(g)
		defer srv.Close()
		for _, key := range []string{"a", "b"} {
			if _, _, err := post(t, srv.URL+"/charges", key, body); err == nil {
				t.Fatalf("key %s: the first answer arrived", key)
			}
			resp, _, err := post(t, srv.URL+"/charges", key, body)
			if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("key %s, second call: %v %v", key, err, resp)
			}
		}
		if n := len(g.Charges()); n != 2 {
			t.Fatalf("%d charges, want 2", n)
		}
	})
	t.Run("query parameters override the configuration", func(t *testing.T) {
		g := fakegateway.New(fakegateway.Faults{FailRate: 1}, nil)
		srv := httptest.NewServer(g)
		defer srv.Close()
		if resp, _, err := post(t, srv.URL+"/charges?fail=0", "k", body); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("fail=0: %v %v", err, resp)
		}
		if _, _, err := post(t, srv.URL+"/charges?fail=0&loseFirst=1", "k2", body); err == nil {
			t.Fatal("loseFirst=1: an answer arrived")
		}
	})
	t.Run("latency", func(t *testing.T) {
		g := fakegateway.New(fakegateway.Faults{}, nil)
		srv := httptest.NewServer(g)
		defer srv.Close()
		start := time.Now()
		if resp, _, err := post(t, srv.URL+"/charges?latency=100ms", "k", body); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("%v %v", err, resp)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Fatalf("answered after %v, want at least the 100ms latency", d)
		}
	})
}

func TestFaultsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    fakegateway.Faults
		wantErr string
	}{
		{env: nil, want: fakegateway.Faults{}},
		{env: map[string]string{"GATEWAY_LATENCY": "20ms", "GATEWAY_FAIL_RATE": "0.1", "GATEWAY_LOSE_RATE": "0.2", "GATEWAY_LOSE_FIRST": "1"},
			want: fakegateway.Faults{Latency: 20 * time.Millisecond, FailRate: 0.1, LoseRate: 0.2, LoseFirst: true}},
		{env: map[string]string{"GATEWAY_LATENCY": "-1s"}, wantErr: "GATEWAY_LATENCY"},
		{env: map[string]string{"GATEWAY_FAIL_RATE": "1.5"}, wantErr: "GATEWAY_FAIL_RATE"},
		{env: map[string]string{"GATEWAY_LOSE_RATE": "NaN"}, wantErr: "GATEWAY_LOSE_RATE"},
		{env: map[string]string{"GATEWAY_LOSE_FIRST": "sometimes"}, wantErr: "GATEWAY_LOSE_FIRST"},
		{env: map[string]string{"GATEWAY_FAIL_RATE": "0.6", "GATEWAY_LOSE_RATE": "0.6"}, wantErr: "more than 1"},
	} {
		got, err := fakegateway.FaultsFromEnv(func(k string) string { return tc.env[k] })
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v %v, want %+v", tc.env, got, err, tc.want)
		}
	}
}

func TestChargesURL(t *testing.T) {
	for _, tc := range []struct{ base, want string }{
		{"http://127.0.0.1:9090", "http://127.0.0.1:9090/charges"},
		{"http://127.0.0.1:9090/", "http://127.0.0.1:9090/charges"},
		{"http://gw.test/v1/?lose=0.2&fail=0.1", "http://gw.test/v1/charges?lose=0.2&fail=0.1"},
		{"127.0.0.1:9090", ""},
		{"ftp://gw.test", ""},
	} {
		got, err := fakegateway.ChargesURL(tc.base)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("ChargesURL(%q) = %q, %v; want %q", tc.base, got, err, tc.want)
		}
	}
}

// A provider deduplicates by idempotency key: the second call with a key answers
// the first charge and charges nothing.
func Example() {
	g := fakegateway.New(fakegateway.Faults{}, nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amountCents":1250,"currency":"EUR"}`))
		req.Header.Set("Idempotency-Key", "merchant-demo:order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", len(g.Charges()))
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// charges: 1
}
