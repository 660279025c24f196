package middleware

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
)

// WithProblemTypeBase makes the "type" of each problem the middleware answers
// base followed by its code, e.g. with "https://api.example.com/problems/" the
// 409 is of type "https://api.example.com/problems/request_in_flight", a page
// your API documents (RFC 9457 section 3.1.1: a type URI should resolve to
// human-readable documentation). Default: ProblemTypePrefix, a URN that does
// not resolve.
//
// With a base, the problems of the IETF draft's error scenarios (the 400 of a
// missing key, the 422 of a key reused, and the 409 of a request in flight,
// draft-ietf-httpapi-idempotency-key-header-07 section 2.7, which shows each
// with "Link: <documentation>; rel="describedby"") also carry
// Link: <type>; rel="describedby" (RFC 8288), the same URI as their type; the
// 422 fingerprint_rule_changed does too, as a key reused. Other problems have
// no Link.
//
// New refuses a base that is not an absolute URI (RFC 3986 section 4.3: a
// scheme, no fragment) or that holds a byte outside the URI characters. See
// docs/request-rules.md section 4.
func WithProblemTypeBase(base string) Option { return func(c *config) { c.typeBase = base } }

// problemStyle says how problems are rendered: their extension members
// (WithProblemMembers) and the start of their type (WithProblemTypeBase).
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

func checkTypeBase(base string) error {
	if base == "" {
		return nil
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
	case !u.IsAbs() || u.Fragment != "" || u.RawFragment != "" || bytes.IndexByte([]byte(base), '#') >= 0:
		return fmt.Errorf("idemkey/middleware: problem type base %q is not an absolute URI (a scheme, no fragment)", base)
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
