package middleware

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
)

// The same bytes sent with another media type are another request: 422, not a
// replay of what the first was answered, under every body mode.
func TestContentTypeCounts(t *testing.T) {
	types := []string{"text/plain", "application/x-www-form-urlencoded", "application/json", "application/json; charset=utf-16", ""}
	for name, rule := range fpModes(t) {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, echoHandler, WithRequestFingerprint(rule))
			n := 0
			for i, a := range types {
				for j, b := range types {
					if i == j {
						continue
					}
					n++
					key := "k" + strconv.Itoa(n)
					first := e.do(req("POST", "/p", key, `{"a":1}`, ctHeader(a)...))
					if first.Code != http.StatusCreated {
						t.Fatalf("%q: %d %s", a, first.Code, first.Body)
					}
					checkProblem(t, e.do(req("POST", "/p", key, `{"a":1}`, ctHeader(b)...)), http.StatusUnprocessableEntity, CodeMismatch)
				}
			}
			// Spellings of one media type are one request.
			first := e.do(req("POST", "/p", "same", `{"a":1}`, "Content-Type", "application/json; charset=utf-8"))
			again := e.do(req("POST", "/p", "same", `{"a":1}`, "Content-Type", `Application/JSON ;Charset="UTF-8"`))
			if again.Header().Get(DefaultReplayedHeader) != "true" || again.Body.String() != first.Body.String() {
				t.Fatalf("a respelled media type: %d %v", again.Code, again.Header())
			}
		})
	}
}

func ctHeader(ct string) []string {
	if ct == "" {
		return nil
	}
	return []string{"Content-Type", ct}
}

func fpModes(t *testing.T) map[string]FingerprintRule {
	return map[string]FingerprintRule{
		"raw":       {},
		"canonical": {CanonicalJSON: true},
		"only":      {Body: mustRule(t)(fingerprint.OnlyJSONFields("/a"))},
		"ignore":    {Body: mustRule(t)(fingerprint.IgnoreJSONFields("/b"))},
	}
}

// A record stored before the upgrade (format version 1, no Content-Type in
// it) keeps being judged by version 1: its retry is replayed (completed) or
// answered 409 (in flight), never 422 and never run again; a request that
// version 1 tells apart from the record is still a 422.
func TestVersion1RecordJudgedByVersion1(t *testing.T) {
	for name, rule := range fpModes(t) {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, echoHandler, WithRequestFingerprint(rule))
			ctx := context.Background()
			n := 0
			for _, ct := range []string{"", "application/json", "text/plain; charset=utf-8"} {
				for _, body := range []string{`{"a":1}`, `{"b":2,"a":1}`, `{"a":[1,{"c":null}]}`} {
					n++
					key := "k" + strconv.Itoa(n)
					r := req("POST", "/p?x=1", key, body, ctHeader(ct)...)
					old := v1Fingerprint(t, rule, r, body)
					id := store.ID{Scope: "anonymous", Key: key}
					res, err := e.mem.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: old, Lease: time.Minute, Retention: time.Hour})
					if err != nil || res.Outcome != store.Claimed {
						t.Fatal(res, err)
					}
					checkProblem(t, e.do(req("POST", "/p?x=1", key, body, ctHeader(ct)...)), http.StatusConflict, CodeInFlight)
					if err := e.mem.Complete(ctx, id, res.Token, store.Response{Status: 201, Body: []byte("stored")}, time.Hour); err != nil {
						t.Fatal(err)
					}
					w := e.do(req("POST", "/p?x=1", key, body, ctHeader(ct)...))
					if w.Code != 201 || w.Body.String() != "stored" {
						t.Fatalf("%s %q: %d %q, want the stored answer", ct, body, w.Code, w.Body)
					}
					checkProblem(t, e.do(req("POST", "/p?x=2", key, body, ctHeader(ct)...)), http.StatusUnprocessableEntity, CodeMismatch)
				}
			}
			if c := e.calls.Load(); c != 0 {
				t.Fatalf("%d handler runs, want none", c)
			}
		})
	}
}

func v1Fingerprint(t *testing.T, rule FingerprintRule, r *http.Request, body string) store.Fingerprint {
	t.Helper()
	req := fingerprint.Request{Method: r.Method, Route: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery, Body: []byte(body)}
	fp, err := fingerprint.Sum(req, fingerprint.Options{CanonicalJSON: rule.CanonicalJSON, Rule: rule.Body, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
