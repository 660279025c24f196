package middleware

import (
	"context"
	"net/http"
)

// refuseKey answers 400 idempotency_key_invalid for a key the validator refused.
func (m *Middleware) refuseKey(w http.ResponseWriter, ctx context.Context, err error) {
	detail := boundDetail(err.Error())
	if detail == "" {
		detail = "The " + m.keyHeader + " header does not have the form this operation requires."
	}
	m.writeProblem(w, nil, http.StatusBadRequest, problem{Title: "Invalid Idempotency-Key header",
		Status: http.StatusBadRequest, Code: CodeKeyInvalid, Detail: detail}.render(m.problemStyle()), 0)
	m.observe(ctx, Event{Decision: KeyInvalid, Status: http.StatusBadRequest, Err: err})
}
