package fingerprint

import (
	"encoding/binary"
	"net/http"
	"strings"
)

// ContentType returns h's Content-Type as Request.ContentType takes it: ""
// when absent, the lines joined by ',' when sent in several (a handler reads
// the first; a second line then only tells requests apart).
func ContentType(h http.Header) string { return joinedLines(h["Content-Type"]) }

// maxMediaParams is the most parameters a normalised media type keeps apart;
// a value with more is taken as sent.
const maxMediaParams = 8

// param locates one media type parameter in the field value: its name, and its
// value as sent (quotes included).
type param struct{ name, value string }

// appendMediaType appends the length-prefixed normal form of a Content-Type
// value (RFC 9110 section 8.3.1): a 0 byte, the type/subtype lower-cased, then
// the parameters sorted by their lower-cased names, each name and value
// length-prefixed; quoted values unquoted ("a" equals a); the charset's value
// lower-cased (charset names are case-insensitive, section 8.3.2), every other
// value kept as sent (a multipart boundary is case-sensitive). Whitespace
// around ';' does not count. Every parameter counts: charset changes how a
// text or form body is read, boundary how a multipart one is split, and a
// handler may read any other. A value that does not parse (or has more than
// maxMediaParams parameters) is a 1 byte and the value as sent, so it never
// equals a parsed one. "" (no Content-Type) is a lone 0 byte and a zero length.
func appendMediaType(e []byte, v string) []byte {
	var ps [maxMediaParams]param
	typ, rest, _ := strings.Cut(v, ";")
	typ = trimOWS(typ)
	n, ok := 0, v == "" || isMediaType(typ)
	for ok && rest != "" {
		var p param
		p, rest, ok = nextParam(rest)
		switch {
		case !ok || p.name == "":
		case n == maxMediaParams:
			ok = false
		default:
			// insertion sort by name, stable
			i := n
			for ; i > 0 && lowerLess(p.name, ps[i-1].name); i-- {
				ps[i] = ps[i-1]
			}
			ps[i] = p
			n++
		}
	}
	if !ok {
		e = append(e, 1)
		e = binary.AppendUvarint(e, uint64(len(v)))
		return append(e, v...)
	}
	e = append(e, 0)
	e = appendLower(binary.AppendUvarint(e, uint64(len(typ))), typ)
	e = binary.AppendUvarint(e, uint64(n))
	for _, p := range ps[:n] {
		e = appendLower(binary.AppendUvarint(e, uint64(len(p.name))), p.name)
		val := p.value
		if val != "" && val[0] == '"' {
			e = appendUnquoted(e, val, strings.EqualFold(p.name, "charset"))
		} else if strings.EqualFold(p.name, "charset") {
			e = appendLower(binary.AppendUvarint(e, uint64(len(val))), val)
		} else {
			e = append(binary.AppendUvarint(e, uint64(len(val))), val...)
		}
	}
	return e
}

// nextParam parses one "; name=value" parameter from s (the text after a ';')
// and returns it and the text after its ';'. An empty segment (";;" or a
// trailing ';') has an empty name. ok is false for anything else that is not
// name=token or name=quoted-string.
func nextParam(s string) (p param, rest string, ok bool) {
	seg := s
	if q := strings.IndexByte(s, '"'); q >= 0 {
		// A quoted value may hold ';': cut after its closing quote.
		end := q + 1
		for end < len(s) && s[end] != '"' {
			if s[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(s) {
			return p, "", false
		}
		if i := strings.IndexByte(s[:q], ';'); i >= 0 {
			seg, rest = s[:i], s[i+1:] // the quote belongs to a later parameter
		} else if i := strings.IndexByte(s[end:], ';'); i >= 0 {
			seg, rest = s[:end+i], s[end+i+1:]
		} else {
			seg, rest = s, ""
		}
	} else if i := strings.IndexByte(s, ';'); i >= 0 {
		seg, rest = s[:i], s[i+1:]
	} else {
		seg, rest = s, ""
	}
	seg = trimOWS(seg)
	if seg == "" {
		return p, rest, true
	}
	name, val, found := strings.Cut(seg, "=")
	if !found || !isToken(name) {
		return p, "", false
	}
	if val != "" && val[0] == '"' {
		if len(val) < 2 || val[len(val)-1] != '"' || !quotedOK(val) {
			return p, "", false
		}
	} else if !isToken(val) {
		return p, "", false
	}
	return param{name: name, value: val}, rest, true
}

// quotedOK reports whether q, starting and ending with '"', is one
// quoted-string: no unescaped '"' inside, no '\' at the end.
func quotedOK(q string) bool {
	for i := 1; i < len(q)-1; i++ {
		switch q[i] {
		case '\\':
			if i+1 >= len(q)-1 {
				return false
			}
			i++
		case '"':
			return false
		}
	}
	return true
}

// appendUnquoted appends the length-prefixed contents of the quoted-string q,
// escapes resolved, lower-cased if lower.
func appendUnquoted(e []byte, q string, lower bool) []byte {
	n := 0
	for i := 1; i < len(q)-1; i++ {
		if q[i] == '\\' {
			i++
		}
		n++
	}
	e = binary.AppendUvarint(e, uint64(n))
	for i := 1; i < len(q)-1; i++ {
		if q[i] == '\\' {
			i++
		}
		c := q[i]
		if lower && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		e = append(e, c)
	}
	return e
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// isMediaType reports whether s is token "/" token.
func isMediaType(s string) bool {
	t, sub, ok := strings.Cut(s, "/")
	return ok && isToken(t) && isToken(sub)
}

// isToken reports whether s is an RFC 9110 token (section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

func appendLower(e []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		e = append(e, c)
	}
	return e
}

// lowerLess reports whether a sorts before b, ASCII case ignored.
func lowerLess(a, b string) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return x < y
		}
	}
	return len(a) < len(b)
}
