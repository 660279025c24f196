package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
)

// problem is an RFC 9457 problem details object with the project's `code` extension
// member and, for INSUFFICIENT_FUNDS, `balanceCents`.
type problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail,omitempty"`
	Code         string `json:"code"`
	BalanceCents *int64 `json:"balanceCents,omitempty"`
}

// WriteProblem answers an RFC 9457 problem of the account API: type
// ProblemTypePrefix + lower-case code, title the status text, status, detail
// (omitted when empty) and the code member, as application/problem+json with
// Cache-Control: no-store. It is the one writer of the API's problems: the
// handler's own, and those the servers answer themselves (the probes' 405, the
// client-ID check's 400, echo's 404 and 405).
func WriteProblem(w http.ResponseWriter, status int, code, detail string) {
	writeProblem(w, problem{Status: status, Code: code, Detail: detail})
}

// writeProblem sends p as application/problem+json; Type and Title default from Code and
// Status.
func writeProblem(w http.ResponseWriter, p problem) {
	if p.Type == "" {
		p.Type = ProblemTypePrefix + strings.ToLower(p.Code)
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
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
		writeProblem(w, problem{Status: http.StatusInternalServerError, Code: "INTERNAL_ERROR", Detail: "Internal error."})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}
