package middleware

import (
	"errors"
	"strings"

	"github.com/idemkey/idemkey/store"
)

// ErrInvalidKey is wrapped by every error ParseKey returns.
var ErrInvalidKey = errors.New("idemkey/middleware: invalid idempotency key")

type keyError string

func (e keyError) Error() string { return "idemkey/middleware: invalid idempotency key: " + string(e) }
func (e keyError) Unwrap() error { return ErrInvalidKey }

// ParseKey parses one Idempotency-Key field value and returns the key.
//
// The IETF draft (draft-ietf-httpapi-idempotency-key-header-07, section 2.1)
// makes the field an Item Structured Header (RFC 8941) whose value is a String:
// `"8e03978e-40d5-43e8-bc93-6894a57f9324"`. ParseKey accepts that form, with
// escapes `\"` and `\\` decoded, and, as a fallback for clients that omit the
// quotes, a bare token of RFC 9110 tchar plus ':' and '/' (so bare UUIDs, which
// RFC 8941 would not take as a Token because they may start with a digit, are
// accepted). Parameters after the item (`;name=value`, RFC 8941 section 3.1.2) are
// checked and ignored. Surrounding spaces and tabs are ignored; `"abc"` and `abc`
// name the same key.
//
// Errors (wrapping ErrInvalidKey): an empty key, a key of only spaces (`" "`,
// which no client means as a key), a key over store.MaxKeyLen bytes, control
// characters or other bytes outside the grammar (non-ASCII included), an
// unterminated string, or data after the item (e.g. two keys joined by ',').
func ParseKey(v string) (string, error) {
	v = trimSpaceTab(v)
	if v == "" {
		return "", keyError("empty")
	}
	var key, rest string
	quoted := v[0] == '"'
	if quoted {
		var escaped bool
		end := -1
		for i := 1; i < len(v); i++ {
			c := v[i]
			if c == '\\' {
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", keyError(`backslash not followed by '"' or '\' in string`)
				}
				escaped = true
				i++
				continue
			}
			if c == '"' {
				end = i
				break
			}
			if c < 0x20 || c > 0x7e {
				return "", keyError("control or non-ASCII character in string")
			}
		}
		if end < 0 {
			return "", keyError("unterminated string")
		}
		key, rest = v[1:end], v[end+1:]
		if escaped {
			key = unescapeSFString(key)
		}
	} else {
		i := 0
		for i < len(v) && isKeyTokenChar(v[i]) {
			i++
		}
		key, rest = v[:i], v[i:]
		if key == "" {
			return "", keyError("not a Structured Field string or token")
		}
	}
	if rest != "" {
		if err := checkParams(rest); err != nil {
			return "", err
		}
	}
	switch {
	case key == "":
		return "", keyError("empty")
	case quoted && strings.Trim(key, " ") == "": // a token has no spaces
		return "", keyError("only spaces")
	case len(key) > store.MaxKeyLen:
		return "", keyError("longer than 255 bytes")
	}
	return key, nil
}

// trimSpaceTab is strings.Trim(s, " \t") without building a cutset per call.
func trimSpaceTab(s string) string {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t') {
		j--
	}
	return s[i:j]
}

func unescapeSFString(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// keyTokenLo and keyTokenHi have bit c (c-64) set for each byte c below 64 (64
// to 127) that isKeyTokenChar accepts: ALPHA, DIGIT and "!#$%&'*+-.^_`|~:/".
const (
	keyTokenLo = 0x07ff_ecfa_0000_0000
	keyTokenHi = 0x57ff_ffff_c7ff_fffe
)

// isKeyTokenChar reports whether c is an RFC 9110 tchar, ':' or '/': one table
// load, since it runs for every byte of every key.
func isKeyTokenChar(c byte) bool { return keyTokenTable[c] }

// keyTokenTable holds, for each byte, whether isKeyTokenChar accepts it (from
// keyTokenLo and keyTokenHi).
var keyTokenTable = func() (t [256]bool) {
	for c := range 128 {
		if c < 64 {
			t[c] = keyTokenLo>>c&1 != 0
		} else {
			t[c] = keyTokenHi>>(c-64)&1 != 0
		}
	}
	return t
}()

// checkParams validates RFC 8941 parameters: *( ";" *SP key [ "=" bare-item ] ).
func checkParams(s string) error {
	bad := keyError("unexpected data after the key")
	s = strings.TrimRight(s, " \t")
	for s != "" {
		if s[0] != ';' {
			return bad
		}
		s = strings.TrimLeft(s[1:], " ")
		// key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
		if s == "" || !(s[0] == '*' || 'a' <= s[0] && s[0] <= 'z') {
			return bad
		}
		i := 1
		for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || strings.IndexByte("_-.*", s[i]) >= 0) {
			i++
		}
		s = s[i:]
		if s == "" || s[0] != '=' {
			continue
		}
		s = s[1:]
		n := bareItemLen(s)
		if n == 0 {
			return bad
		}
		s = s[n:]
	}
	return nil
}

// bareItemLen returns the length of the RFC 8941 bare item at the start of s
// (string, token, number, boolean or byte sequence), 0 if there is none.
func bareItemLen(s string) int {
	if s == "" {
		return 0
	}
	switch c := s[0]; {
	case c == '"':
		for i := 1; i < len(s); i++ {
			switch {
			case s[i] == '\\':
				if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
					return 0
				}
				i++
			case s[i] == '"':
				return i + 1
			case s[i] < 0x20 || s[i] > 0x7e:
				return 0
			}
		}
		return 0
	case c == '?':
		if len(s) >= 2 && (s[1] == '0' || s[1] == '1') {
			return 2
		}
		return 0
	case c == ':':
		for i := 1; i < len(s); i++ {
			if s[i] == ':' {
				return i + 1
			}
			if !(s[i] >= 'A' && s[i] <= 'Z' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || strings.IndexByte("+/=", s[i]) >= 0) {
				return 0
			}
		}
		return 0
	case c == '-' || '0' <= c && c <= '9':
		i := 0
		if c == '-' {
			i++
		}
		start := i
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		if i == start {
			return 0
		}
		return i
	case c == '*' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		i := 1
		for i < len(s) && isKeyTokenChar(s[i]) {
			i++
		}
		return i
	}
	return 0
}
