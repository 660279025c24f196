package main

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	const db = "postgres://db"
	base := map[string]string{"DATABASE_URL": db}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		check   func(t *testing.T, c config)
		wantErr string // a substring naming the variable
	}{
		{name: "defaults", env: base, check: func(t *testing.T, c config) {
			if c.addr != "127.0.0.1:8080" || c.lease != 10*time.Second || c.retention != 24*time.Hour || c.gatewayURL != "" ||
				c.tablePrefix != "" || c.faults || len(c.tokens) != 1 || c.tokens["demo"] != "merchant-demo" {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "everything set", env: with("ADDR", "127.0.0.1:0", "GATEWAY_URL", "http://gw:9090", "IDEM_LEASE", "2s", "IDEM_RETENTION", "1h",
			"PAYMENTS_TABLE_PREFIX", "t1_", "PAYMENTS_FAULTS", "1", "PAYMENTS_TOKENS", " a=alice , b=bob@example.com,"),
			check: func(t *testing.T, c config) {
				if c.addr != "127.0.0.1:0" || c.gatewayURL != "http://gw:9090" || c.lease != 2*time.Second || c.retention != time.Hour ||
					c.tablePrefix != "t1_" || !c.faults || len(c.tokens) != 2 || c.tokens["a"] != "alice" || c.tokens["b"] != "bob@example.com" {
					t.Fatalf("%+v", c)
				}
			}},
		{name: "no DATABASE_URL", env: map[string]string{}, wantErr: "DATABASE_URL is required"},
		{name: "lease not a duration", env: with("IDEM_LEASE", "ten"), wantErr: "IDEM_LEASE"},
		{name: "zero retention", env: with("IDEM_RETENTION", "0s"), wantErr: "IDEM_RETENTION"},
		{name: "lease under the minimum", env: with("IDEM_LEASE", "1ns"), wantErr: "IDEM_LEASE=1ns is under the minimum lease"},
		{name: "retention under the lease", env: with("IDEM_LEASE", "1m", "IDEM_RETENTION", "30s"), wantErr: "at least IDEM_LEASE"},
		{name: "prefix with a quote", env: with("PAYMENTS_TABLE_PREFIX", `x"; drop`), wantErr: "PAYMENTS_TABLE_PREFIX"},
		{name: "prefix too long", env: with("PAYMENTS_TABLE_PREFIX", strings.Repeat("a", 33)), wantErr: "PAYMENTS_TABLE_PREFIX"},
		{name: "token without principal", env: with("PAYMENTS_TOKENS", "demo"), wantErr: "PAYMENTS_TOKENS"},
		{name: "token listed twice", env: with("PAYMENTS_TOKENS", "a=x,a=y"), wantErr: "twice"},
		{name: "principal with a colon", env: with("PAYMENTS_TOKENS", "a=x:y"), wantErr: "principal"},
		{name: "only commas", env: with("PAYMENTS_TOKENS", ",,"), wantErr: "no token"},
		{name: "faults not 0 or 1", env: with("PAYMENTS_FAULTS", "yes"), wantErr: "PAYMENTS_FAULTS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want errConfig naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestDecodePayment(t *testing.T) {
	for _, tc := range []struct {
		body       string
		wantStatus int // 0: valid
		wantDetail string
	}{
		{`{"amountCents":1250,"currency":"EUR","customerId":"cust-1"}`, 0, ""},
		{`{"amountCents":100000000,"currency":"JPY","customerId":"a.b_c-D"}`, 0, ""},
		{``, 400, "one JSON object"},
		{`{"amountCents":1`, 400, "one JSON object"},
		{`[1]`, 400, "one JSON object"},
		{`{"amountCents":1,"currency":"EUR","customerId":"c"} {}`, 400, "nothing after it"},
		{`{"amountCents":"12","currency":"EUR","customerId":"c"}`, 422, "amountCents has the wrong type; want an integer"},
		{`{"amountCents":12.5,"currency":"EUR","customerId":"c"}`, 422, "amountCents has the wrong type"},
		{`{"amountCents":1,"currency":"EUR","customerId":"c","tip":1}`, 422, `Unknown field "tip"`},
		{`{"currency":"EUR","customerId":"c"}`, 422, "amountCents"},
		{`{"amountCents":0,"currency":"EUR","customerId":"c"}`, 422, "amountCents"},
		{`{"amountCents":100000001,"currency":"EUR","customerId":"c"}`, 422, "amountCents"},
		{`{"amountCents":1,"currency":"eur","customerId":"c"}`, 422, "currency"},
		{`{"amountCents":1,"customerId":"c"}`, 422, "currency"},
		{`{"amountCents":1,"currency":"EUR","customerId":""}`, 422, "customerId"},
		{`{"amountCents":1,"currency":"EUR","customerId":"a b"}`, 422, "customerId"},
		{`{"amountCents":1,"currency":"EUR","customerId":7}`, 422, "customerId has the wrong type; want a string"},
		// Member names are exact and unique: encoding/json alone would charge 7 here.
		{`{"amountCents":5,"amountcents":7,"currency":"EUR","customerId":"c"}`, 422, `Unknown field "amountcents"`},
		{`{"AMOUNTCENTS":5,"currency":"EUR","customerId":"c"}`, 422, `Unknown field "AMOUNTCENTS"`},
		{`{"amountCents":5,"amountCents":7,"currency":"EUR","customerId":"c"}`, 422, "amountCents appears more than once"},
		{`{"amountCents":null,"amountCents":7,"currency":"EUR","customerId":"c"}`, 422, "amountCents appears more than once"},
		{`{"amount\u0043ents":5,"currency":"EUR","customerId":"c"}`, 0, ""},
		{`{"amountCents":9223372036854775808,"currency":"EUR","customerId":"c"}`, 422, "amountCents has the wrong type"},
		{`{"amountCents":1,"currency":["EUR"],"customerId":"c"}`, 422, "currency has the wrong type; want a string"},
		{`null`, 400, "one JSON object"},
		{`"x"`, 400, "one JSON object"},
		{`{"amountCents":1,"currency":"EUR","customerId":"c",}`, 400, "one JSON object"},
	} {
		pay, status, code, detail := decodePayment(strings.NewReader(tc.body))
		if status != tc.wantStatus || !strings.Contains(detail, tc.wantDetail) {
			t.Errorf("%s: %d %s %q, want %d with %q", tc.body, status, code, detail, tc.wantStatus, tc.wantDetail)
			continue
		}
		if status == 0 && (pay.AmountCents == 0 || pay.Currency == "" || pay.CustomerID == "") {
			t.Errorf("%s: %+v", tc.body, pay)
		}
		if status == 422 && code != codeValidation || status == 400 && code != codeMalformed {
			t.Errorf("%s: code %s for %d", tc.body, code, status)
		}
	}
}

func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want fault
		ok   bool
	}{
		{"crash-after-commit", fault{crashAfterCommit: true}, true},
		{" crash-before-commit ", fault{crashBeforeCommit: true}, true},
		{"slow=250ms", fault{slow: 250 * time.Millisecond}, true},
		{"slow=0s", fault{}, false},
		{"slow=2m", fault{}, false},
		{"slow=soon", fault{}, false},
		{"crash", fault{}, false},
		{"crash-after-commit,slow=1s", fault{}, false},
	} {
		got, err := parseFault(tc.v)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseFault(%q) = %+v, %v; want %+v ok=%v", tc.v, got, err, tc.want, tc.ok)
		}
	}
}
