package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problemTypePrefix starts the RFC 9457 "type" of the payments API's own
// problems, the code follows: the namespace is the API's, not the library's
// (the middleware's problems keep "urn:idemkey:problem:"), so a client tells a
// refused payment from a refused key. "urn:example:" is the namespace RFC 6963
// reserves for examples; a real service uses a URI of its own.
const problemTypePrefix = "urn:example:payments:problem:"

// Problem codes of the payments API: the "code" member of its RFC 9457 problem
// details and the last part of their "type" (problemTypePrefix + code). The
// middleware's own codes (idempotency_key_missing, request_in_flight, ...) come
// from package middleware.
const (
	codeUnauthorized       = "unauthorized"        // 401: no or unknown bearer token
	codeMalformed          = "malformed_request"   // 400: not one JSON object
	codeValidation         = "validation_error"    // 422: a field is missing or out of range
	codeNotFound           = "not_found"           // 404: no such payment for this principal
	codeBadFault           = "bad_fault"           // 400: an X-Fault value the server does not know
	codeGatewayUnavailable = "gateway_unavailable" // 503: the provider failed or did not answer; retry
	codeGatewayRefused     = "gateway_refused"     // 502: the provider refused the charge
	codeLeaseLost          = "lease_lost"          // 409: another request took the key over; retry
	codeDatabase           = "database_unavailable"
)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// problemBody renders a problem's JSON body, newline-terminated.
func problemBody(status int, code, detail string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // detail may say "<token>"
	_ = enc.Encode(problem{Type: problemTypePrefix + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
	return buf.Bytes() // strings and an int: Encode cannot fail; it ends with a newline
}

// writeProblem answers status with an application/problem+json body;
// retryAfter > 0 adds Retry-After in whole seconds (at least 1).
func writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(max(1, int(retryAfter/time.Second))))
	}
	w.WriteHeader(status)
	_, _ = w.Write(problemBody(status, code, detail))
}
