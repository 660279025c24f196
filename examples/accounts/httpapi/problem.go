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
