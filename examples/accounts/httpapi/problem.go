package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
)

// problem is one error answer: an RFC 9457 problem details object with the
// project's `code` extension member, the two members the reference's clients
// read (`error` and `message`, docs/account-service.md section 1.3) and, for
// INSUFFICIENT_FUNDS, `balanceCents`.
//
// The casing rule (docs/architecture.md section 3): `code` is lower snake_case
// in every problem the project answers, the middleware's and the account API's
// alike, and is the last segment of `type`; `error` is the same code in upper
// case, as the reference spells its business codes; `message` repeats `detail`.
type problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail"`
	Code         string `json:"code"`
	Error        string `json:"error"`
	Message      string `json:"message"`
	BalanceCents *int64 `json:"balanceCents,omitempty"`
}

// newProblem fills in a problem from its status, business code (any case) and
// human text.
func newProblem(status int, code, detail string) problem {
	lower := strings.ToLower(code)
	return problem{Type: ProblemTypePrefix + lower, Title: http.StatusText(status), Status: status,
		Detail: detail, Code: lower, Error: strings.ToUpper(code), Message: detail}
}

// WriteProblem answers status with an application/problem+json body in the
// account API's shape (Cache-Control: no-store): type ProblemTypePrefix +
// code, title (the status text), status, detail, code (lower snake_case),
// error (the code in upper case) and message (the detail). code is a business
// code such as "INSUFFICIENT_FUNDS", in either case. It is the one writer of the
// API's problems: the handler's own, and those the servers answer themselves
// (the probes' 405, the client-ID check's 400, echo's 404 and 405).
func WriteProblem(w http.ResponseWriter, status int, code, detail string) {
	writeProblem(w, newProblem(status, code, detail))
}

// ProblemMembers gives the idempotency middleware's problems the two members
// the account API's own carry (middleware.ProblemRule.Members): error, the code
// in upper case (REQUEST_IN_FLIGHT, STORE_UNAVAILABLE, ...), and message, the
// detail. So the reference's page shows the middleware's 400, 409, 413, 422
// and 503 answers in words too.
func ProblemMembers(code, detail string) map[string]any {
	return map[string]any{"error": strings.ToUpper(code), "message": detail}
}

// writeProblem sends p as application/problem+json.
func writeProblem(w http.ResponseWriter, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: only strings and integers
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// writeJSON sends v as a 200 application/json answer.
func writeJSON(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		WriteProblem(w, http.StatusInternalServerError, "INTERNAL_ERROR", "Internal error.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}
