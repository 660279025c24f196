package middleware

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// A custom rule that panics, whatever it panics with, is contained: 500
// fingerprint_rule_failed, the handler not run, no record left for the key
// (the next request with the key, once the rule is fixed, runs).
func TestCustomRulePanicContained(t *testing.T) {
	var nilMap map[string]int
	panics := map[string]func(){
		"string":      func() { panic("boom") },
		"error":       func() { panic(errors.New("boom")) },
		"nil map":     func() { nilMap["x"] = 1 },
		"index":       func() { _ = []int{}[len(nilMap)+1] },
		"nil":         func() { panic(nil) },
		"huge string": func() { panic(strings.Repeat("x", 1<<20)) },
	}
	for name, f := range panics {
		t.Run(name, func(t *testing.T) {
			broken := true
			rule := mustRule(t)(fingerprint.NewRule("custom/v1", func(dst, body []byte) ([]byte, error) {
				if broken {
					f()
				}
				return append(dst, body...), nil
			}))
			e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{Body: rule}))
			p := checkProblem(t, e.do(req("POST", "/p", "k1", "x")), http.StatusInternalServerError, CodeRuleFailed)
			if strings.Contains(p.Detail, "boom") || len(p.Detail) > maxDetail {
				t.Errorf("detail %q", p.Detail)
			}
			if ev := e.lastEvent(); !errors.Is(ev.Err, fingerprint.ErrRulePanicked) || ev.Status != 500 {
				t.Errorf("event %+v", ev)
			}
			info, err := e.mem.Inspect(context.Background(), store.ID{Scope: "anonymous", Key: "k1"})
			if err != nil || info.State != store.StateAbsent || e.calls.Load() != 0 {
				t.Fatalf("after the panic: %v %v, %d runs", info.State, err, e.calls.Load())
			}
			broken = false
			if w := e.do(req("POST", "/p", "k1", "x")); w.Code != http.StatusCreated || e.calls.Load() != 1 {
				t.Fatalf("after the fix: %d", w.Code)
			}
		})
	}
}

// A custom rule's refusal is answered with the rule's own message (not "not
// JSON"), cut to maxDetail bytes at a rune boundary, for messages of every
// length up to 1 MiB.
func TestCustomRuleRefusalUsesItsMessage(t *testing.T) {
	for _, n := range []int{1, 100, maxDetail - 1, maxDetail, maxDetail + 1, 4096, 1 << 20} {
		for _, unit := range []string{"a", "é", "€", "𝄞"} {
			msg := strings.Repeat(unit, n/len(unit))
			if msg == "" {
				continue
			}
			rule := mustRule(t)(fingerprint.NewRule("custom/v1", func(dst, body []byte) ([]byte, error) {
				return dst, errors.New(msg)
			}))
			e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{Body: rule}))
			p := checkProblem(t, e.do(req("POST", "/p", "k"+strconv.Itoa(n), "x")), http.StatusBadRequest, CodeBodyRefused)
			if len(p.Detail) > maxDetail || !strings.HasPrefix(msg, strings.TrimSuffix(p.Detail, "...")) || strings.Contains(p.Title, "JSON") {
				t.Fatalf("%d bytes of %q: title %q, detail %d bytes %.40q", len(msg), unit, p.Title, len(p.Detail), p.Detail)
			}
			if len(msg) <= maxDetail && p.Detail != msg {
				t.Fatalf("detail %q, want %q", p.Detail, msg)
			}
		}
	}
	// a rule's ErrInvalidJSON is still "not JSON"
	rule := mustRule(t)(fingerprint.NewRule("custom/v1", func(dst, body []byte) ([]byte, error) {
		return dst, fingerprint.ErrInvalidJSON
	}))
	e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{Body: rule}))
	checkProblem(t, e.do(req("POST", "/p", "k", "x")), http.StatusBadRequest, CodeBodyNotJSON)
}

// A key validator's message is bounded the same way.
func TestKeyValidatorDetailBounded(t *testing.T) {
	long := strings.Repeat("é", 1<<19)
	e := newEnv(t, echoHandler, WithKey(policy.KeyRule{Validate: func(string) error { return errors.New(long) }}))
	p := checkProblem(t, e.do(req("POST", "/p", "k", "x")), http.StatusBadRequest, CodeKeyInvalid)
	if len(p.Detail) > maxDetail || !strings.HasPrefix(long, strings.TrimSuffix(p.Detail, "...")) {
		t.Fatalf("detail %d bytes", len(p.Detail))
	}
}
