package middleware

import (
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store/memory"
)

// Over bases generated from schemes, authorities, paths, queries, fragments
// and lengths, New accepts exactly the absolute http(s) URLs with a host, no
// user information, query or fragment, ending in '/', of at most
// MaxTypeBaseLen bytes; each accepted base makes types base+code.
func TestProblemTypeBaseValidated(t *testing.T) {
	schemes := []string{"https://", "http://", "HTTPS://", "javascript:", "data:text/html,", "ftp://", "urn:", "", "//", "file://"}
	hosts := []string{"api.example.com", "", "user:pw@api.example.com", "api.example.com:8443", "[::1]"}
	paths := []string{"/problems/", "/problems", "/", "", "/a b/", "/x\"/", "/" + strings.Repeat("p", 300) + "/", "/" + strings.Repeat("p", 200) + "/"}
	tails := []string{"", "?v=1/", "#top/", "?"}
	n := 0
	for _, sc := range schemes {
		for _, h := range hosts {
			for _, p := range paths {
				for _, tail := range tails {
					base := sc + h + p + tail
					if base == "" {
						continue
					}
					want := (sc == "https://" || sc == "http://" || sc == "HTTPS://") && h != "" && !strings.Contains(h, "@") &&
						tail == "" && strings.HasSuffix(base, "/") && !strings.ContainsAny(p, " \"") && len(base) <= MaxTypeBaseLen
					m, err := New(memory.New(), GlobalScope, WithProblems(ProblemRule{TypeBase: base}))
					if (err == nil) != want {
						t.Errorf("%.80q: New error %v, want accepted %v", base, err, want)
						continue
					}
					if want {
						n++
						if got := m.problemStyle().typeOf(CodeInFlight); got != base+CodeInFlight {
							t.Errorf("type %q", got)
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no base accepted")
	}
}
