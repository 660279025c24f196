// Package httpfield checks HTTP field names, so that an option naming a header
// that no request can carry fails when the middleware or client is built, not
// on every request.
package httpfield

// ValidName reports whether name is a valid field name: a token of one or more
// tchar (RFC 9110 sections 5.1 and 5.6.2): letters, digits and
// !#$%&'*+-.^_`|~. Spaces, colons, separators, control and non-ASCII bytes are
// not.
func ValidName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && c != 0 && contains("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return true
}

func contains(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}
