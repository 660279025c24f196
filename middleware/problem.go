package middleware

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/store"
)

// ProblemTypePrefix starts the RFC 9457 "type" URI of every problem the
// middleware answers; the code follows it, e.g.
// "urn:idemkey:problem:request_in_flight".
const ProblemTypePrefix = "urn:idemkey:problem:"

// Problem codes: the stable "code" member of the problem details (RFC 9457
// section 3.2 extension member) and the last part of their "type".
const (
	// CodeKeyMissing: 400, a protected request without the key header where the
	// key is required (IETF draft section 2.7).
	CodeKeyMissing = "idempotency_key_missing"
	// CodeKeyInvalid: 400, the key is empty, over 255 bytes, not a Structured
	// Field string or token, or sent in several header lines; or the store refused
	// the scope and key as arguments (store.ErrInvalid, e.g. too long together).
	CodeKeyInvalid = "idempotency_key_invalid"
	// CodeScopeInvalid: 400, the request's scope (the principal or tenant its
	// keys belong to, as the ScopeFunc names it) is over store.MaxScopeLen bytes,
	// the limit of every store.
	CodeScopeInvalid = "idempotency_scope_invalid"
	// CodeBodyUnreadable: 400, the request body could not be read.
	CodeBodyUnreadable = "request_body_unreadable"
	// CodeRequestTooLarge: 413, the request body is over the fingerprint limit.
	CodeRequestTooLarge = "request_too_large"
	// CodeInFlight: 409, a request with the same key and payload is being
	// processed; Retry-After says when to retry (IETF draft section 2.7).
	CodeInFlight = "request_in_flight"
	// CodeMismatch: 422, the key was already used with another payload, method or
	// route (IETF draft section 2.7).
	CodeMismatch = "key_reused_with_different_payload"
	// CodeStoreUnavailable: 503, the idempotency store could not answer; retry
	// after Retry-After.
	CodeStoreUnavailable = "store_unavailable"
)

// ProblemContentType is the media type of every error the middleware answers
// (RFC 9457 section 3).
const ProblemContentType = "application/problem+json"

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// render returns the problem's JSON body, with the extension members of
// ProblemRule.Members after the problem's own. A members function that fails on
// this problem (New checked every code, with a sample detail for the variable
// ones) gives the body without extension members: always a whole problem.
func (p problem) render(style problemStyle) []byte {
	b, _ := p.renderErr(style)
	return b
}

// reservedMembers are the members every problem carries itself; an extension
// member may not name one in any case (encoding/json matches names without
// regard to case, so "Code" would read as code).
var reservedMembers = [...]string{"type", "title", "status", "detail", "code"}

// renderErr is render that also says why the extension members were left out.
func (p problem) renderErr(style problemStyle) ([]byte, error) {
	p.Type = style.typeOf(p.Code)
	members := style.members
	b, _ := json.Marshal(p) // strings and an int: cannot fail
	b = append(b, '\n')
	if members == nil {
		return b, nil
	}
	extra, err := p.members(members)
	if err != nil || len(extra) == 0 {
		return b, err
	}
	for name := range extra {
		for _, own := range reservedMembers {
			if strings.EqualFold(name, own) {
				return b, fmt.Errorf("idemkey/middleware: problem members for %q name %q, a member of every problem", p.Code, name)
			}
		}
	}
	e, err := json.Marshal(extra) // a map: members in the order of their names
	if err != nil {
		return b, fmt.Errorf("idemkey/middleware: problem members for %q: %w", p.Code, err)
	}
	// b is {...}\n: replace its closing brace and newline with the extra members.
	out := make([]byte, 0, len(b)+len(e))
	out = append(append(out, b[:len(b)-2]...), ',')
	return append(append(out, e[1:]...), '\n'), nil
}

// members calls f for p, turning a panic into an error.
func (p problem) members(f func(code, detail string) map[string]any) (extra map[string]any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("idemkey/middleware: problem members for %q panicked: %v", p.Code, r)
		}
	}()
	return f(p.Code, p.Detail), nil
}

// prerendered holds the bodies of the problems without a variable detail.
type prerendered struct {
	missing, inFlight, mismatch, storeDown, keyRefused, scopeTooLong, scopeSeveral []byte
}

// newPrerendered renders the problems without a variable detail, and checks
// members on the others' codes with a sample detail: the error is New's.
func newPrerendered(style problemStyle) (prerendered, error) {
	var firstErr error
	r := func(p problem) []byte {
		b, err := p.renderErr(style)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return b
	}
	for _, code := range []string{CodeKeyInvalid, CodeBodyUnreadable, CodeRequestTooLarge, CodeBodyNotJSON, CodeBodyDuplicateName, CodeBodyRefused, CodeRuleFailed} {
		r(problem{Code: code, Detail: "sample detail"})
	}
	return prerendered{
		missing: r(problem{Title: "Idempotency-Key header missing", Status: http.StatusBadRequest, Code: CodeKeyMissing,
			Detail: "This operation requires an Idempotency-Key header; send one and retry."}),
		inFlight: r(problem{Title: "Request in flight", Status: http.StatusConflict, Code: CodeInFlight,
			Detail: "A request with this idempotency key is still being processed; retry after the Retry-After delay."}),
		mismatch: r(problem{Title: "Idempotency key reused", Status: http.StatusUnprocessableEntity, Code: CodeMismatch,
			Detail: "This idempotency key was already used for a different request (method, route, query or body); use a new key."}),
		keyRefused: r(problem{Title: "Invalid Idempotency-Key header", Status: http.StatusBadRequest, Code: CodeKeyInvalid,
			Detail: "The idempotency store does not accept this key or its scope."}),
		scopeTooLong: r(problem{Title: "Idempotency scope too long", Status: http.StatusBadRequest, Code: CodeScopeInvalid,
			Detail: "The scope of this request (the client or tenant its idempotency keys belong to, e.g. a client ID header) is longer than " +
				strconv.Itoa(store.MaxScopeLen) + " bytes; use a shorter one."}),
		scopeSeveral: r(problem{Title: "Idempotency scope sent several times", Status: http.StatusBadRequest, Code: CodeScopeInvalid,
			Detail: "The header naming the client or tenant this request's idempotency keys belong to was sent on several lines; send it once."}),
		storeDown: r(problem{Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable, Code: CodeStoreUnavailable,
			Detail: "The request could not be checked for duplicates and was not processed; retry after the Retry-After delay."}),
	}, firstErr
}

// writeProblem answers status with body, a prerendered problem; retryAfter > 0
// adds Retry-After in whole seconds. The header values are copies, from c's
// chunk (call.headerValues; nil c: allocated), of values shared by every
// response: an outer middleware that edits one in place changes only this
// response.
func (m *Middleware) writeProblem(w http.ResponseWriter, c *call, status int, body []byte, retryAfter time.Duration) {
	link := m.problemLink(status, body)
	var ra []string
	if retryAfter > 0 {
		if secs := retryAfterSeconds(retryAfter); secs < int64(len(m.retryAfterVals)) {
			ra = m.retryAfterVals[secs]
		} else {
			ra = []string{strconv.FormatInt(secs, 10)}
		}
	}
	h := w.Header()
	vals := c.headerValues(len(m.problemHeaders) + len(link) + len(ra))
	vals = setValues(h, "Content-Type", vals, m.problemHeaders[0:1])
	vals = setValues(h, "Cache-Control", vals, m.problemHeaders[1:2])
	vals = setValues(h, "X-Content-Type-Options", vals, m.problemHeaders[2:3])
	if link != nil {
		vals = setValues(h, "Link", vals, link)
	}
	if ra != nil {
		setValues(h, "Retry-After", vals, ra)
	}
	w.WriteHeader(status)
	w.Write(body)
}

// retryAfterSeconds is d in whole seconds, rounded down so a 409's Retry-After
// never exceeds the remaining lease, and at least 1 (whole seconds, at least 1, at most the
// remaining lease; below one second, at least 1 wins).
func retryAfterSeconds(d time.Duration) int64 {
	return max(int64(d/time.Second), 1)
}
