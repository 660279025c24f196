package fingerprint

import (
	"bytes"
	"slices"
)

// MaxJSONDepth is the deepest nesting of arrays and objects AppendCanonicalJSON
// accepts; deeper input is a *JSONError. It is encoding/json's own limit, so a
// JSON rule never refuses a body encoding/json decodes for its depth.
const MaxJSONDepth = 10000

// AppendCanonicalJSON appends the canonical form of the JSON value src (RFC 8259)
// to dst:
//
//   - insignificant whitespace is removed;
//   - object members are sorted by their key's bytes as sent (between the
//     quotes, escapes not decoded);
//   - strings and numbers are kept exactly as sent (no escape or number
//     normalisation), arrays are never reordered.
//
// src must hold exactly one value, optionally surrounded by whitespace, nested at
// most MaxJSONDepth deep: the grammar and limits of encoding/json's Unmarshal.
// Like encoding/json it accepts invalid UTF-8 in strings (which decode it as
// U+FFFD); such bytes are kept as sent, so they never equal U+FFFD or another
// invalid byte here. Otherwise it returns dst
// unchanged and a *JSONError (wrapping ErrInvalidJSON). An object whose member
// names repeat once escapes are decoded and case folded, as encoding/json
// matches them, has no canonical form: a *NameError (wrapping
// ErrDuplicateName), since decoders disagree on which duplicate counts and
// sorting would hide the order that decides it. It never panics.
func AppendCanonicalJSON(dst, src []byte) ([]byte, error) {
	var c canonicalizer
	out, err := c.run(src)
	if err != nil {
		return dst, err
	}
	return append(dst, out...), nil
}

// canonicalizer holds the scratch buffers of one canonicalisation; reused.
type canonicalizer struct {
	src   []byte
	pos   int
	depth int
	out   []byte
	tmp   []byte
	spans []member
	fold  []byte     // folded member names of one object (checkNames)
	folds []foldSpan // their spans
}

// member locates one object member written to out: key contents [k0,k1), the
// whole member "key":value [k0-1, end); src is the key's offset in the body.
type member struct{ k0, k1, end, src int }

func (c *canonicalizer) run(src []byte) ([]byte, error) {
	c.src, c.pos, c.depth = src, 0, 0
	c.out, c.spans = c.out[:0], c.spans[:0]
	defer func() { c.src = nil }()
	c.skipSpace()
	if err := c.value(); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos != len(c.src) {
		return nil, c.fail("data after the JSON value (the whole body must be one value, as for json.Unmarshal; a json.Decoder would read only the first)")
	}
	return c.out, nil
}

func (c *canonicalizer) fail(reason string) error {
	return &JSONError{Offset: c.pos, Reason: reason}
}

func (c *canonicalizer) unexpected() error {
	if c.pos >= len(c.src) {
		return c.fail("unexpected end of input")
	}
	b := c.src[c.pos]
	if b >= 0x20 && b < 0x7f {
		return c.fail("unexpected byte '" + string(rune(b)) + "'")
	}
	return c.fail("unexpected byte")
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value() error {
	if c.pos >= len(c.src) {
		return c.unexpected()
	}
	switch b := c.src[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		return c.str()
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return c.unexpected()
}

func (c *canonicalizer) literal(lit string) error {
	if !bytes.HasPrefix(c.src[c.pos:], []byte(lit)) {
		return c.fail("invalid literal")
	}
	c.out = append(c.out, lit...)
	c.pos += len(lit)
	return nil
}

func (c *canonicalizer) enter() error {
	c.depth++
	if c.depth > MaxJSONDepth {
		return c.fail("nested too deeply")
	}
	return nil
}

func (c *canonicalizer) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.unexpected()
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return nil
		default:
			return c.unexpected()
		}
	}
}

func (c *canonicalizer) object() error {
	if err := c.enter(); err != nil {
		return err
	}
	c.pos++ // '{'
	start := len(c.out)
	c.out = append(c.out, '{')
	base := len(c.spans)
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return c.unexpected()
		}
		k0, src := len(c.out)+1, c.pos
		if err := c.str(); err != nil {
			return err
		}
		k1 := len(c.out) - 1
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return c.unexpected()
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.spans = append(c.spans, member{k0: k0, k1: k1, end: len(c.out), src: src})
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.unexpected()
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			continue
		case '}':
			c.pos++
		default:
			return c.unexpected()
		}
		break
	}
	// Members were written back to back without commas; lay them out sorted.
	members := c.spans[base:]
	if err := c.checkNames(members); err != nil {
		return err
	}
	out := c.out
	slices.SortStableFunc(members, func(a, b member) int {
		return bytes.Compare(out[a.k0:a.k1], out[b.k0:b.k1])
	})
	c.tmp = append(c.tmp[:0], c.out[start+1:]...)
	c.out = c.out[:start+1]
	for i, m := range members {
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.tmp[m.k0-1-(start+1):m.end-(start+1)]...)
	}
	c.out = append(c.out, '}')
	c.spans = c.spans[:base]
	c.depth--
	return nil
}

// str copies one string token, validating escapes and control bytes.
func (c *canonicalizer) str() error {
	begin := c.pos
	c.pos++ // opening quote
	for c.pos < len(c.src) {
		b := c.src[c.pos]
		switch {
		case b == '"':
			c.pos++
			c.out = append(c.out, c.src[begin:c.pos]...)
			return nil
		case b < 0x20:
			return c.fail("control character in string")
		case b == '\\':
			c.pos++
			if c.pos >= len(c.src) {
				return c.unexpected()
			}
			switch c.src[c.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				c.pos++
			case 'u':
				c.pos++
				for range 4 {
					if c.pos >= len(c.src) || !isHex(c.src[c.pos]) {
						return c.fail("invalid \\u escape")
					}
					c.pos++
				}
			default:
				return c.fail("invalid escape")
			}
		default:
			c.pos++
		}
	}
	return c.unexpected()
}

// number copies one number token after checking the RFC 8259 grammar:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (c *canonicalizer) number() error {
	begin := c.pos
	if c.src[c.pos] == '-' {
		c.pos++
	}
	switch {
	case c.pos < len(c.src) && c.src[c.pos] == '0':
		c.pos++
	case c.pos < len(c.src) && '1' <= c.src[c.pos] && c.src[c.pos] <= '9':
		c.digits()
	default:
		return c.fail("invalid number")
	}
	if c.pos < len(c.src) && c.src[c.pos] == '.' {
		c.pos++
		if c.digits() == 0 {
			return c.fail("invalid number")
		}
	}
	if c.pos < len(c.src) && (c.src[c.pos] == 'e' || c.src[c.pos] == 'E') {
		c.pos++
		if c.pos < len(c.src) && (c.src[c.pos] == '+' || c.src[c.pos] == '-') {
			c.pos++
		}
		if c.digits() == 0 {
			return c.fail("invalid number")
		}
	}
	c.out = append(c.out, c.src[begin:c.pos]...)
	return nil
}

func (c *canonicalizer) digits() int {
	n := 0
	for c.pos < len(c.src) && '0' <= c.src[c.pos] && c.src[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}
