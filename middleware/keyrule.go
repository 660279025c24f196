package middleware

import (
	"context"
	"errors"
	"net/http"
)

// errNotUUID is UUIDKeys' error; its text is the detail of the 400.
var errNotUUID = errors.New("the key must be a UUID in its 36-character text form (RFC 9562 section 4), e.g. 8e03978e-40d5-43e8-bc93-6894a57f9324")

// UUIDKeys is a key validator (KeyRule.Validate) that accepts only UUIDs in
// their text form: 32 hexadecimal digits, either case, in groups of 8, 4, 4, 4
// and 12 joined by '-' (RFC 9562 section 4), of any version or variant; the
// IETF draft's examples use such keys. Any other key is refused with an error
// saying so.
func UUIDKeys(key string) error {
	if len(key) != 36 {
		return errNotUUID
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return errNotUUID
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return errNotUUID
			}
		}
	}
	return nil
}

// refuseKey answers 400 idempotency_key_invalid for a key the validator refused.
func (m *Middleware) refuseKey(w http.ResponseWriter, ctx context.Context, err error) {
	detail := err.Error()
	if detail == "" {
		detail = "The " + m.keyHeader + " header does not have the form this operation requires."
	}
	m.writeProblem(w, nil, http.StatusBadRequest, problem{Title: "Invalid Idempotency-Key header",
		Status: http.StatusBadRequest, Code: CodeKeyInvalid, Detail: detail}.render(m.problemStyle()), 0)
	m.observe(ctx, Event{Decision: KeyInvalid, Status: http.StatusBadRequest, Err: err})
}
