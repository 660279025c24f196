package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"sync"
)

// pathTrie holds the JSON Pointers of IgnoreJSONFields, token by token; leaf
// marks the end of a pointer (its value is ignored, and what is below it too).
type pathTrie struct {
	leaf bool
	kids map[string]*pathTrie
}

func newPathTrie(ptrs [][]string) *pathTrie {
	root := &pathTrie{}
	for _, toks := range ptrs {
		n := root
		for _, t := range toks {
			if n.kids == nil {
				n.kids = make(map[string]*pathTrie)
			}
			k := n.kids[t]
			if k == nil {
				k = &pathTrie{}
				n.kids[t] = k
			}
			n = k
		}
		n.leaf = true
	}
	return root
}

// ignoredElement stands for an ignored array element in what IgnoreJSONFields
// fingerprints: a byte no canonical JSON text holds outside a string, and none
// inside one (control bytes are escaped), so it equals no value.
const ignoredElement = 0x00

// jsonWalker reads canonical JSON (the output of canonicalizer: valid, without
// whitespace), so it only has to find where each value ends.
type jsonWalker struct {
	src []byte
	pos int
}

// skipValue moves past the value at pos.
func (w *jsonWalker) skipValue() {
	switch w.src[w.pos] {
	case '"':
		w.skipString()
	case '{', '[':
		depth := 0
		for {
			switch w.src[w.pos] {
			case '"':
				w.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			w.pos++
			if depth == 0 {
				return
			}
		}
	default: // number, true, false, null
		for w.pos < len(w.src) {
			switch w.src[w.pos] {
			case ',', ']', '}':
				return
			}
			w.pos++
		}
	}
}

func (w *jsonWalker) skipString() {
	w.pos++
	for w.src[w.pos] != '"' {
		if w.src[w.pos] == '\\' {
			w.pos++
		}
		w.pos++
	}
	w.pos++
}

// memberKid returns the node of kids that the quoted member name k names, with
// escapes resolved (so "a\u0062" is the member ab), as a JSON Pointer token
// names it; nil if none.
func memberKid(kids map[string]*pathTrie, k []byte) *pathTrie {
	if bytes.IndexByte(k, '\\') < 0 {
		return kids[string(k[1:len(k)-1])] // no copy
	}
	return kids[decodeName(k)]
}

// memberIs reports whether the quoted member name k is tok, escapes resolved.
func memberIs(k []byte, tok string) bool {
	if bytes.IndexByte(k, '\\') < 0 {
		return string(k[1:len(k)-1]) == tok
	}
	return decodeName(k) == tok
}

func decodeName(k []byte) string {
	var s string
	_ = json.Unmarshal(k, &s) // validated by the canonicalizer
	return s
}

// canonPool holds canonicalizers for the JSON rules.
var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// canonicalFor runs f on the canonical form of body, with a pooled
// canonicalizer.
func canonicalFor(dst, body []byte, f func(dst, canon []byte) []byte) ([]byte, error) {
	c := canonPool.Get().(*canonicalizer)
	defer func() {
		if cap(c.out) <= 4<<20 { // do not pool huge buffers
			canonPool.Put(c)
		}
	}()
	canon, err := c.run(body)
	if err != nil {
		return dst, err
	}
	return f(dst, canon), nil
}

// ignore appends the value at pos without the members and elements n marks.
func (w *jsonWalker) ignore(dst []byte, n *pathTrie) []byte {
	start := w.pos
	if n == nil || n.kids == nil || w.src[start] != '{' && w.src[start] != '[' {
		w.skipValue()
		return append(dst, w.src[start:w.pos]...)
	}
	open := w.src[start]
	closing := byte('}')
	if open == '[' {
		closing = ']'
	}
	dst = append(dst, open)
	w.pos++
	wrote := false
	for i := 0; w.src[w.pos] != closing; i++ {
		var kid *pathTrie
		k0 := w.pos
		if open == '{' {
			w.skipString()
			kid = memberKid(n.kids, w.src[k0:w.pos])
			w.pos++ // ':'
		} else {
			kid = n.kids[strconv.Itoa(i)]
		}
		switch {
		case kid != nil && kid.leaf && open == '{':
			w.skipValue() // as if absent
		case kid != nil && kid.leaf:
			w.skipValue()
			dst = appendSep(dst, wrote)
			dst = append(dst, ignoredElement)
			wrote = true
		default:
			dst = appendSep(dst, wrote)
			dst = append(dst, w.src[k0:w.pos]...) // the key and ':' of a member; nothing in an array
			dst = w.ignore(dst, kid)
			wrote = true
		}
		if w.src[w.pos] == ',' {
			w.pos++
		}
	}
	w.pos++
	return append(dst, closing)
}

func appendSep(dst []byte, wrote bool) []byte {
	if wrote {
		return append(dst, ',')
	}
	return dst
}

// kind returns the JSON type of the value starting with c: one of '{', '[',
// '"', 't' (true), 'f' (false), 'n' (null), or '0' for a number.
func kind(c byte) byte {
	if c == '-' || '0' <= c && c <= '9' {
		return '0'
	}
	return c
}

// onlyPath is one path of OnlyJSONFields: its reference tokens, and each one
// folded as encoding/json folds a member name (appendFolded).
type onlyPath struct {
	toks, folded []string
}

func newOnlyPaths(ptrs [][]string) []onlyPath {
	paths := make([]onlyPath, len(ptrs))
	for i, toks := range ptrs {
		paths[i].toks = toks
		for _, t := range toks {
			paths[i].folded = append(paths[i].folded, string(appendFolded(nil, []byte(t))))
		}
	}
	return paths
}

// appendOnly appends, for each path in order, what is found at it: a 1 byte and
// the length-prefixed canonical value for a match, then a 0 byte (so an absent
// path is a lone 0). A member that matches a token only once case is folded
// (encoding/json reads it into the field the token names) also appends a 2 byte
// and its length-prefixed name as sent before what is found below it: a decoder
// matching names exactly (into a map) reads it elsewhere, so it must not pass
// for the token's own spelling. Where the path meets a value it cannot go into
// (a scalar, null, or an array for a token that is no index), a 3 byte and the
// value's JSON type are appended. Exact matches and absent members of an object
// append nothing more, so their fingerprints are those of only-json-fields/v1
// before folding existed.
func appendOnly(dst, body []byte, paths []onlyPath) ([]byte, error) {
	return canonicalFor(dst, body, func(dst, canon []byte) []byte {
		for _, p := range paths {
			w := jsonWalker{src: canon}
			dst = w.find(dst, p.toks, p.folded)
			dst = append(dst, 0)
		}
		return dst
	})
}

// find appends every value at toks below the value at pos, and moves past it;
// folded holds toks folded. Member names of one object never fold alike (the
// canonicalizer refuses such a body), so at most one member matches a token.
func (w *jsonWalker) find(dst []byte, toks, folded []string) []byte {
	start := w.pos
	if len(toks) == 0 {
		w.skipValue()
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, uint64(w.pos-start))
		return append(dst, w.src[start:w.pos]...)
	}
	open := w.src[start]
	closing, idx := byte('}'), -1
	if open == '[' {
		closing, idx = ']', arrayIndex(toks[0])
	}
	if open != '{' && idx < 0 {
		// The path cannot go on: a decoder that expects an object here reads
		// a scalar, null or array as an error or as nothing, so the kind of
		// value counts.
		w.skipValue()
		return append(dst, 3, kind(open))
	}
	w.pos++
	for i := 0; w.src[w.pos] != closing; i++ {
		match := i == idx
		if open == '{' {
			k0 := w.pos
			w.skipString()
			k := w.src[k0:w.pos]
			match = memberIs(k, toks[0])
			if !match && nameFolds(k, folded[0]) {
				match = true
				dst = append(dst, 2)
				dst = binary.AppendUvarint(dst, uint64(len(k)))
				dst = append(dst, k...)
			}
			w.pos++ // ':'
		}
		if match {
			dst = w.find(dst, toks[1:], folded[1:])
		} else {
			w.skipValue()
		}
		if w.src[w.pos] == ',' {
			w.pos++
		}
	}
	w.pos++
	return dst
}
