package policy

import "errors"

// errNotUUID and errUpperUUID are UUIDKeys' errors; their text is the detail
// of the invalid-key answer (HTTP 400, gRPC INVALID_ARGUMENT).
var (
	errNotUUID   = errors.New("the key must be a UUID in its 36-character lower-case text form (RFC 9562 section 4), e.g. 8e03978e-40d5-43e8-bc93-6894a57f9324")
	errUpperUUID = errors.New("the key must be a UUID in lower case (RFC 9562 section 4: UUIDs are written in lower case and compare case-insensitively, so one UUID must have one spelling); send this key lower-cased, and keep it so on every retry")
)

// UUIDKeys is a key rule (KeyRule.Validate, for the HTTP middleware and the gRPC
// interceptor alike) that accepts only UUIDs in their lower-case text form:
// 32 hexadecimal digits, 0-9 and a-f, in groups of
// 8, 4, 4, 4 and 12 joined by '-' (RFC 9562 section 4), of any version or
// variant; the IETF draft's examples use such keys. Any other key is refused
// with an error saying so, an upper-case hex digit included: UUIDs compare
// case-insensitively, and two spellings of one UUID accepted as two keys would
// run a retry that changed its case twice. Refusing one spelling keeps the key
// the client sent as the key stored (logs and inspection show it as sent), and
// the common generators (crypto.randomUUID, Go's and Python's uuid, Java's
// UUID.toString) write lower case; a client whose platform writes upper case
// (Swift's uuidString) lower-cases it once.
func UUIDKeys(key string) error {
	if len(key) != 36 {
		return errNotUUID
	}
	upper := false
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return errNotUUID
			}
		default:
			switch {
			case '0' <= c && c <= '9' || 'a' <= c && c <= 'f':
			case 'A' <= c && c <= 'F':
				upper = true
			default:
				return errNotUUID
			}
		}
	}
	if upper {
		return errUpperUUID
	}
	return nil
}
