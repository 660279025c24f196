package middleware

import (
	"context"
	"net/http"
	"strings"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
)

// Problem codes of the fingerprint rules (FingerprintRule.Body).
const (
	// CodeBodyNotJSON: 400, the operation fingerprints JSON members
	// (fingerprint.OnlyJSONFields, IgnoreJSONFields) and the request body is not
	// one JSON value (or the rule refused it). Nothing is stored and the handler
	// does not run: the client's mistake, which a retry repeats.
	CodeBodyNotJSON = "request_body_not_json"
	// CodeRuleChanged: 422, the key's record was made under another fingerprint
	// rule than the operation's (or under none), so this request cannot be
	// compared with the first; the stored record is untouched. Told apart from
	// CodeMismatch when the store implements store.Inspector (every store of this
	// module does); otherwise the 422 is CodeMismatch.
	CodeRuleChanged = "fingerprint_rule_changed"
)

// refuseBody answers 400 request_body_not_json for a body the rule cannot read.
func (m *Middleware) refuseBody(w http.ResponseWriter, ctx context.Context, id store.ID, err error) {
	m.writeProblem(w, nil, http.StatusBadRequest, problem{Title: "Request body is not JSON",
		Status: http.StatusBadRequest, Code: CodeBodyNotJSON,
		Detail: "This operation fingerprints members of a JSON request body, and this body is not one JSON value: " +
			strings.TrimPrefix(err.Error(), "idemkey/fingerprint: ") + "."}.render(m.problemStyle()), 0)
	m.observe(ctx, Event{Decision: BodyUnreadable, ID: id, Status: http.StatusBadRequest, Err: err})
}

// mismatchBody returns the body of a 422 for a key whose claim was a mismatch:
// fingerprint_rule_changed when the store shows the stored fingerprint was made
// under another rule than the middleware's, else key_reused_with_different_payload.
// Only with a rule (FingerprintRule.Body) and a store.Inspector: one more round trip,
// on the mismatch path only, bounded like a claim; a failure gives the plain
// mismatch.
func (m *Middleware) mismatchBody(parent context.Context, id store.ID) []byte {
	in, ok := m.store.(store.Inspector)
	if m.fpRule == nil || !ok {
		return m.problems.mismatch
	}
	ctx, cancel := m.claimer.Bound(parent, m.timeouts.Claim)
	info, err := in.Inspect(ctx, id)
	cancel()
	if err != nil || info.State == store.StateAbsent || fingerprint.SameRule(info.Fingerprint, m.fpRule) {
		return m.problems.mismatch
	}
	return m.ruleChangedBody
}
