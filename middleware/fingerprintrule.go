package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

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
	// CodeBodyDuplicateName: 400, the operation fingerprints JSON members and an
	// object of the body holds two member names that are one name once escapes
	// are decoded and case is folded, as encoding/json matches them
	// (fingerprint.ErrDuplicateName): decoders disagree on which one counts, so
	// the body has no one meaning to fingerprint. Nothing is stored and the
	// handler does not run.
	CodeBodyDuplicateName = "request_body_duplicate_name"
	// CodeBodyRefused: 400, the operation's custom fingerprint rule
	// (fingerprint.NewRule) refused the body with its own error, whose text is
	// the detail (at most 512 bytes). Nothing is stored and the handler does
	// not run.
	CodeBodyRefused = "request_body_refused"
	// CodeRuleFailed: 500, the operation's custom fingerprint rule panicked
	// (fingerprint.ErrRulePanicked): the panic is contained and logged, nothing
	// is claimed, the handler does not run.
	CodeRuleFailed = "fingerprint_rule_failed"
	// CodeRuleChanged: 422, the key's record was made under another fingerprint
	// rule than the operation's (or under none), so this request cannot be
	// compared with the first; the stored record is untouched. Told apart from
	// CodeMismatch when the store implements store.Inspector (every store of this
	// module does); otherwise the 422 is CodeMismatch.
	CodeRuleChanged = "fingerprint_rule_changed"
)

// maxDetail bounds a problem detail that quotes an error (a rule's, a key
// validator's), in bytes: a detail is for a person, and an error may quote a
// whole body.
const maxDetail = 512

// boundDetail cuts s to maxDetail bytes, at a rune boundary, marked with "...".
func boundDetail(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	cut := maxDetail - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// refuseBody answers a body the rule could not fingerprint: 400
// request_body_not_json (not JSON), request_body_duplicate_name (colliding
// member names) or request_body_refused (a custom rule's own error, its text
// as the detail); 500 when a custom rule panicked. Nothing was claimed yet.
func (m *Middleware) refuseBody(w http.ResponseWriter, ctx context.Context, id store.ID, err error) {
	text := strings.TrimPrefix(err.Error(), "idemkey/fingerprint: ")
	p := problem{Title: "Request body is not JSON", Status: http.StatusBadRequest, Code: CodeBodyNotJSON,
		Detail: "This operation fingerprints members of a JSON request body, and this body is not one JSON value: " + text + "."}
	var re *fingerprint.RuleError
	switch {
	case errors.Is(err, fingerprint.ErrRulePanicked):
		p = problem{Title: "Fingerprint rule failed", Status: http.StatusInternalServerError, Code: CodeRuleFailed,
			Detail: "This operation's fingerprint rule failed on this request; nothing ran. Retrying will not help until the service is fixed."}
		m.logger.LogAttrs(ctx, slog.LevelError, "idempotency fingerprint rule panicked; answering 500, nothing claimed",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	case errors.Is(err, fingerprint.ErrDuplicateName):
		p.Title, p.Code = "Request body repeats a member name", CodeBodyDuplicateName
		p.Detail = "This operation fingerprints members of a JSON request body, and an object of this body names one member twice: " +
			text + ". Send each member once."
	case errors.As(err, &re) && !errors.Is(err, fingerprint.ErrInvalidJSON):
		p.Title, p.Code = "Request body refused", CodeBodyRefused
		p.Detail = re.Err.Error()
	}
	p.Detail = boundDetail(p.Detail)
	m.writeProblem(w, nil, p.Status, p.render(m.problemStyle()), 0)
	m.observe(ctx, Event{Decision: BodyUnreadable, ID: id, Status: p.Status, Err: err})
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

// sum returns the fingerprint of r (its body read, its route named) in format
// version v (0: the current one): under the rule, or in canonical JSON form,
// or, for a body that is not JSON without a rule, its raw bytes (the handler
// judges the body). An error is the rule's: the body is refused.
func (m *Middleware) sum(r *http.Request, body []byte, route string, v int) (store.Fingerprint, error) {
	req := fingerprint.Request{Method: r.Method, Route: route, RawQuery: r.URL.RawQuery, Body: body,
		ContentEncoding: fingerprint.ContentEncoding(r.Header), ContentType: fingerprint.ContentType(r.Header)}
	fp, err := fingerprint.Sum(req, fingerprint.Options{CanonicalJSON: m.canonicalJSON, Rule: m.fpRule, Version: v})
	if err != nil && m.fpRule == nil {
		return fingerprint.Sum(req, fingerprint.Options{Version: v})
	}
	return fp, err
}

// claimAsV1 judges a record stored before the fingerprint covered the
// Content-Type (format version 1; fingerprint.Options.Version): when the claim
// was a mismatch, it claims again with the request's version-1 fingerprint,
// which the store compares with the record's as it did before the upgrade. So a
// retry across an upgrade replays (or waits for) its record, neither 422 nor a
// re-run; a record stored under the current version is a mismatch for both.
// One more round trip, on the mismatch path only. The second answer replaces
// the first (its latency added): a store failure there is a 503, since the
// record may be this request's.
func (m *Middleware) claimAsV1(ctx context.Context, r *http.Request, body []byte, route string, tx bool, a *answer) {
	if a.err != nil || a.res.Outcome != store.Mismatch {
		return
	}
	old, err := m.sum(r, body, route, 1)
	if err != nil {
		return
	}
	b := m.claimKey(ctx, a.id, old, tx)
	b.latency += a.latency
	b.waited += a.waited
	*a = b
}
