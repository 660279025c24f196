package middleware

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/policy"
)

// Over generated UUIDs: the lower-case spelling is accepted, every spelling
// with an upper-case hex digit is refused, so one UUID is one key and a retry
// that changed its case is a 400, never a second run.
func TestUUIDKeysOneSpellingPerUUID(t *testing.T) {
	e := newEnv(t, echoHandler, WithKey(policy.KeyRule{Validate: policy.UUIDKeys}))
	for i := range 200 {
		var u [16]byte
		rand.Read(u[:])
		lower := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
		if err := policy.UUIDKeys(lower); err != nil {
			t.Fatalf("%s: %v", lower, err)
		}
		// upper-case a generated subset of its letters (never none)
		mask := uint64(i)*0x9e3779b97f4a7c15 | 1
		var b strings.Builder
		letters := 0
		for _, c := range lower {
			if 'a' <= c && c <= 'f' {
				if mask>>(letters%64)&1 == 1 {
					c -= 'a' - 'A'
				}
				letters++
			}
			b.WriteRune(c)
		}
		mixed := b.String()
		if mixed == lower { // no letter at all: every digit
			continue
		}
		before := e.calls.Load()
		if w := e.do(req("POST", "/p", lower, "x")); w.Code != http.StatusCreated {
			t.Fatalf("%s: %d", lower, w.Code)
		}
		checkProblem(t, e.do(req("POST", "/p", mixed, "x")), http.StatusBadRequest, CodeKeyInvalid)
		if n := e.calls.Load() - before; n != 1 {
			t.Fatalf("%s then %s: %d runs", lower, mixed, n)
		}
	}
}
