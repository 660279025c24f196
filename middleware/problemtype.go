package middleware

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// problemStyle says how problems are rendered: their extension members
// (ProblemRule.Members) and the start of their type (ProblemRule.TypeBase).
type problemStyle struct {
	members  func(code, detail string) map[string]any
	typeBase string
}

func (m *Middleware) problemStyle() problemStyle {
	return problemStyle{members: m.problemMembers, typeBase: m.typeBase}
}

// typeOf returns the type URI of the problem with code.
func (s problemStyle) typeOf(code string) string {
	if s.typeBase == "" {
		return ProblemTypePrefix + code
	}
	return s.typeBase + code
}

// MaxTypeBaseLen is the longest ProblemRule.TypeBase New accepts, in bytes:
// the base is sent in every problem's type and Link field.
const MaxTypeBaseLen = 256

// checkTypeBase checks ProblemRule.TypeBase: "" (the URN), or an absolute http
// or https URL with a host, no user information, query or fragment, ending in
// '/' (the code is appended to it: without the '/', ".../problems" would give
// ".../problemsrequest_in_flight"), made of URI characters, at most
// MaxTypeBaseLen bytes. A type is a page a client's developer opens, so
// another scheme (javascript:, data:, file:) is refused.
func checkTypeBase(base string) error {
	if base == "" {
		return nil
	}
	if len(base) > MaxTypeBaseLen {
		return fmt.Errorf("idemkey/middleware: problem type base is %d bytes, over the limit of %d", len(base), MaxTypeBaseLen)
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"<>\^`+"`{|}"), c) >= 0 {
			return fmt.Errorf("idemkey/middleware: problem type base %q: byte %q is not a URI character (RFC 3986)", base, c)
		}
	}
	u, err := url.Parse(base)
	switch {
	case err != nil:
		return fmt.Errorf("idemkey/middleware: problem type base %q: %w", base, err)
	case !strings.EqualFold(u.Scheme, "https") && !strings.EqualFold(u.Scheme, "http"), u.Host == "", u.Opaque != "":
		return fmt.Errorf("idemkey/middleware: problem type base %q is not an absolute http or https URL with a host", base)
	case u.User != nil, strings.ContainsAny(base, "?#"):
		return fmt.Errorf("idemkey/middleware: problem type base %q has user information, a query or a fragment", base)
	case !strings.HasSuffix(base, "/"):
		return fmt.Errorf("idemkey/middleware: problem type base %q does not end in '/' (the problem's code is appended to it)", base)
	}
	return nil
}

// links holds the Link field values of the problems that carry one.
type links struct {
	missing, inFlight, mismatch, ruleChanged []string
}

func newLinks(base string) *links {
	l := func(code string) []string { return []string{"<" + base + code + `>; rel="describedby"`} }
	return &links{missing: l(CodeKeyMissing), inFlight: l(CodeInFlight), mismatch: l(CodeMismatch), ruleChanged: l(CodeRuleChanged)}
}

// problemLink returns the Link value of the problem answered with status and
// body (one of the prerendered bodies), or nil.
func (m *Middleware) problemLink(status int, body []byte) []string {
	if m.links == nil || len(body) == 0 {
		return nil
	}
	same := func(b []byte) bool { return len(b) > 0 && &b[0] == &body[0] }
	switch {
	case status == http.StatusConflict:
		return m.links.inFlight
	case status == http.StatusUnprocessableEntity && same(m.ruleChangedBody):
		return m.links.ruleChanged
	case status == http.StatusUnprocessableEntity:
		return m.links.mismatch
	case status == http.StatusBadRequest && same(m.problems.missing):
		return m.links.missing
	}
	return nil
}
