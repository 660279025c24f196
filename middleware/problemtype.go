package middleware

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
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
