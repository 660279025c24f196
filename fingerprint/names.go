package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// ErrDuplicateName is wrapped by *NameError: an object of the body holds two
// member names that a decoder reads as one (see NameError), so the body has no
// one meaning to fingerprint.
var ErrDuplicateName = errors.New("idemkey/fingerprint: duplicate member name in JSON body")

// NameError reports an object holding two member names that are equal after
// decoding their escapes (RFC 8259 section 7; an invalid UTF-8 byte or a lone
// surrogate read as U+FFFD) and folding their case as encoding/json matches
// names to struct fields (Unicode simple folding: "amount", "AMOUNT",
// "\u0061mount" and "Amount" are one name). encoding/json keeps the last of
// them, other decoders the first or refuse the body; the canonical form cannot
// tell which one a handler reads, so such a body is not canonicalised. It wraps
// ErrDuplicateName.
type NameError struct {
	// Offset is the byte offset in the body of the second name.
	Offset int
	// Name is that name as sent (escapes not decoded), at most 64 bytes of it.
	Name string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("idemkey/fingerprint: JSON member name %q at byte %d repeats an earlier name of its object (names are compared after decoding escapes and folding case, as encoding/json matches them)", e.Name, e.Offset)
}

// Unwrap returns ErrDuplicateName.
func (e *NameError) Unwrap() error { return ErrDuplicateName }

// appendFoldedName appends the folded form of the member name raw (the bytes
// between its quotes, as sent): escapes decoded as encoding/json decodes them,
// then each ASCII letter upper-cased and every other rune replaced by the
// smallest rune of its simple-fold orbit, which is how encoding/json folds a
// name before it looks up a struct field. Two names fold alike exactly when
// encoding/json's case-insensitive match (bytes.EqualFold) takes them as one.
func appendFoldedName(dst, raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') >= 0 {
		var s string
		q := make([]byte, 0, len(raw)+2) // rare: names with escapes
		q = append(append(append(q, '"'), raw...), '"')
		_ = json.Unmarshal(q, &s) // validated by the canonicalizer
		raw = []byte(s)
	}
	return appendFolded(dst, raw)
}

// appendFolded appends the folded form of the decoded name s (see
// appendFoldedName).
func appendFolded(dst, s []byte) []byte {
	raw := s
	for i := 0; i < len(raw); {
		c := raw[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(raw[i:]) // an invalid byte is U+FFFD, as encoding/json reads it
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst
}

// nameFolds reports whether the quoted member name k (as in canonical JSON)
// folds to folded, a name already folded (appendFolded).
func nameFolds(k []byte, folded string) bool {
	k = k[1 : len(k)-1]
	if len(k) == len(folded) {
		same, ascii := asciiFoldsTo(k, folded)
		if ascii {
			return same
		}
	} else if simpleName(k) {
		return false // ASCII folding keeps the length
	}
	var buf [64]byte
	return string(appendFoldedName(buf[:0], k)) == folded
}

// asciiFoldsTo reports whether k, upper-cased, is folded; ascii is false when
// k holds a byte that is not ASCII or a '\' (same is then meaningless).
func asciiFoldsTo(k []byte, folded string) (same, ascii bool) {
	same = true
	for i, c := range k {
		if c >= utf8.RuneSelf || c == '\\' {
			return false, false
		}
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		same = same && c == folded[i]
	}
	return same, true
}

// simpleName reports whether the raw name k is ASCII without escapes: its
// folded form is then its upper-cased bytes, as long as k.
func simpleName(k []byte) bool {
	for _, c := range k {
		if c >= utf8.RuneSelf || c == '\\' {
			return false
		}
	}
	return true
}

// asciiEqualFold reports whether the simple names a and b fold alike.
func asciiEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i, c := range a {
		d := b[i]
		if c != d {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			if 'a' <= d && d <= 'z' {
				d -= 'a' - 'A'
			}
			if c != d {
				return false
			}
		}
	}
	return true
}

// foldRune returns the smallest rune of r's simple-fold orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// checkNames returns a *NameError when two of members (just parsed, keys in
// c.out) fold to one name. Folded names go to c.fold; objects of up to 8
// members are compared pairwise, larger ones sorted.
func (c *canonicalizer) checkNames(members []member) error {
	if len(members) < 2 {
		return nil
	}
	if len(members) <= 8 && c.simpleNames(members) {
		// The common case: short objects of ASCII names without escapes,
		// compared pairwise in place.
		for i := 1; i < len(members); i++ {
			for j := range i {
				if asciiEqualFold(c.out[members[i].k0:members[i].k1], c.out[members[j].k0:members[j].k1]) {
					return c.nameError(members[i])
				}
			}
		}
		return nil
	}
	c.fold, c.folds = c.fold[:0], c.folds[:0]
	for i, m := range members {
		f0 := len(c.fold)
		c.fold = appendFoldedName(c.fold, c.out[m.k0:m.k1])
		c.folds = append(c.folds, foldSpan{f0, len(c.fold), i})
	}
	fold := c.fold
	name := func(s foldSpan) []byte { return fold[s.f0:s.f1] }
	dup := -1
	if len(c.folds) <= 8 {
		for i := 1; i < len(c.folds) && dup < 0; i++ {
			for j := range i {
				if bytes.Equal(name(c.folds[i]), name(c.folds[j])) {
					dup = i
					break
				}
			}
		}
	} else {
		slices.SortFunc(c.folds, func(a, b foldSpan) int {
			if r := bytes.Compare(name(a), name(b)); r != 0 {
				return r
			}
			return a.i - b.i
		})
		for i := 1; i < len(c.folds); i++ {
			if bytes.Equal(name(c.folds[i]), name(c.folds[i-1])) && (dup < 0 || c.folds[i].i < dup) {
				dup = c.folds[i].i
			}
		}
	}
	if dup < 0 {
		return nil
	}
	return c.nameError(members[dup])
}

func (c *canonicalizer) simpleNames(members []member) bool {
	for _, m := range members {
		if !simpleName(c.out[m.k0:m.k1]) {
			return false
		}
	}
	return true
}

// nameError reports m's name as a repeat of an earlier one.
func (c *canonicalizer) nameError(m member) error {
	n := c.out[m.k0:m.k1]
	if len(n) > 64 {
		n = n[:64]
	}
	return &NameError{Offset: m.src, Name: string(n)}
}

// foldSpan locates one folded name in canonicalizer.fold; i is its member's
// index in the object.
type foldSpan struct{ f0, f1, i int }
