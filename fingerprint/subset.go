package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemkey/idemkey/store"
)

// ErrInvalidRule is wrapped by every error of the Rule constructors: a JSON
// Pointer that is not RFC 6901 syntax, no path, an empty rule identity or a nil
// function.
var ErrInvalidRule = errors.New("idemkey/fingerprint: invalid body rule")

// ErrRulePanicked is wrapped by Sum's error when a custom rule's BodyFunc
// panicked: the panic is contained, and the request has no fingerprint.
var ErrRulePanicked = errors.New("idemkey/fingerprint: body rule panicked")

// RuleError is Sum's error when a custom rule's BodyFunc returned an error
// that does not wrap ErrInvalidJSON: the rule refused the body. Err is the
// rule's own error, Rule its ID.
type RuleError struct {
	Rule string
	Err  error
}

func (e *RuleError) Error() string {
	return "idemkey/fingerprint: rule " + e.Rule + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *RuleError) Unwrap() error { return e.Err }

// BodyFunc is a custom body rule: it appends to dst the bytes of body that the
// fingerprint covers and returns them. It is called with the complete body as
// sent (see Request.Body), must not modify or retain body, and must be a pure
// function of body (the same bytes always give the same result), safe for
// concurrent use. An error wrapping ErrInvalidJSON says the body is not what
// the rule reads (the middleware answers 400 request_body_not_json); any other
// error is the rule's refusal, which Sum returns as a *RuleError (the
// middleware answers 400 request_body_refused with its text). A panic is
// contained: Sum returns an error wrapping ErrRulePanicked (the middleware
// answers 500, nothing claimed).
type BodyFunc func(dst, body []byte) ([]byte, error)

// Rule says which part of a request body the fingerprint covers; the method,
// route, query and Content-Encoding are always covered. Build one with
// OnlyJSONFields, IgnoreJSONFields or NewRule and pass it as Options.Rule. A
// Rule is immutable and safe for concurrent use.
//
// A fingerprint made under a rule records the rule's identity (ID), so a record
// stored under one rule never matches a request fingerprinted under another, or
// under none: changing the rule of a route cannot replay an answer to a request
// the new rule would have told apart. SameRule tells the two kinds of mismatch
// apart (the middleware answers 422 fingerprint_rule_changed for the second).
type Rule struct {
	id    string
	tag   [ruleTagLen]byte
	apply BodyFunc
	// appends is set for the JSON rules, whose apply only appends to dst, so
	// its result may be kept as the next call's dst; a custom BodyFunc may
	// return another slice (even body's), which is never kept.
	appends bool
}

// Layout of a fingerprint made under a rule: ruleMagic, then the first 4 bytes of
// the SHA-256 of the rule's ID, then the first 24 bytes of the request's digest.
// A fingerprint without a rule is a whole SHA-256 digest, unchanged.
const (
	ruleMagic  = "\xd1\xe3\x7a\x52"
	ruleTagLen = 8
)

// ID returns the rule's identity: for OnlyJSONFields and IgnoreJSONFields the
// constructor's name, a version and the sorted paths (e.g.
// `only-json-fields/v1["/amount","/to"]`); for NewRule the id given.
func (r *Rule) ID() string { return r.id }

// NewRule returns a rule that fingerprints the bytes f returns. id names the
// rule and its version, e.g. "payments-body/v2"; change it whenever f changes
// what it keeps, so records stored under the old f are not replayed to requests
// the new one fingerprints differently. Errors (wrapping ErrInvalidRule): an
// empty id or a nil f.
func NewRule(id string, f BodyFunc) (*Rule, error) {
	switch {
	case id == "":
		return nil, fmt.Errorf("%w: empty rule id", ErrInvalidRule)
	case f == nil:
		return nil, fmt.Errorf("%w: nil body function", ErrInvalidRule)
	}
	r := &Rule{id: id, apply: f}
	copy(r.tag[:], ruleMagic)
	sum := sha256.Sum256([]byte("idemkey/fingerprint/rule\x00" + id))
	copy(r.tag[len(ruleMagic):], sum[:])
	return r, nil
}

// OnlyJSONFields returns a rule that fingerprints only the values at paths, JSON
// Pointers (RFC 6901: "" is the whole document, "/a/0/b" the member b of the
// first element of the array a, "~1" stands for '/' and "~0" for '~' in a
// name). Each value is fingerprinted in canonical form (AppendCanonicalJSON);
// an absent path counts as absent, which differs from any value, null included.
// Members named like a path in several duplicates are all covered. An array
// index is "0" or digits without a leading zero; "-" and other names match no
// element. The body must be one JSON value, otherwise Sum fails with a
// *JSONError (wrapping ErrInvalidJSON); an empty body too.
//
// Errors (wrapping ErrInvalidRule): no path, or a path that is not a JSON
// Pointer (not starting with '/', or '~' not followed by '0' or '1').
func OnlyJSONFields(paths ...string) (*Rule, error) {
	ptrs, id, err := parsePointers("only-json-fields/v1", paths, true)
	if err != nil {
		return nil, err
	}
	only := newOnlyPaths(ptrs)
	r, err := NewRule(id, func(dst, body []byte) ([]byte, error) { return appendOnly(dst, body, only) })
	if r != nil {
		r.appends = true
	}
	return r, err
}

// IgnoreJSONFields returns a rule that fingerprints the body's canonical JSON
// form (AppendCanonicalJSON) without the values at paths, JSON Pointers as in
// OnlyJSONFields: an ignored object member is left out, as if absent (a client
// may add or drop it); an ignored array element keeps its place, so the other
// elements keep their indices. Duplicated member names are all ignored. The body
// must be one JSON value, otherwise Sum fails with a *JSONError (wrapping
// ErrInvalidJSON); an empty body too.
//
// Errors (wrapping ErrInvalidRule): no path, the path "" (the whole body: use
// no body at all in the fingerprint deliberately, with NewRule), or a path that
// is not a JSON Pointer.
func IgnoreJSONFields(paths ...string) (*Rule, error) {
	ptrs, id, err := parsePointers("ignore-json-fields/v1", paths, false)
	if err != nil {
		return nil, err
	}
	trie := newPathTrie(ptrs)
	r, err := NewRule(id, func(dst, body []byte) ([]byte, error) {
		return canonicalFor(dst, body, func(dst, canon []byte) []byte {
			w := jsonWalker{src: canon}
			return w.ignore(dst, trie)
		})
	})
	if r != nil {
		r.appends = true
	}
	return r, err
}

// SameRule reports whether the stored fingerprint was made under r (nil: under
// no rule), as far as it can tell: a fingerprint made without a rule carries no
// mark, and is taken as made under a rule with a chance of 1 in 2^32.
func SameRule(stored store.Fingerprint, r *Rule) bool {
	if r == nil {
		return string(stored[:len(ruleMagic)]) != ruleMagic
	}
	return [ruleTagLen]byte(stored[:ruleTagLen]) == r.tag
}

// sum is Sum under r: the body's part the rule keeps, behind the rule's ID.
func (r *Rule) sum(s *state, req Request, v1 bool) (store.Fingerprint, error) {
	if r.apply == nil {
		return store.Fingerprint{}, fmt.Errorf("%w: the zero Rule (use a constructor)", ErrInvalidRule)
	}
	out, err := r.run(s.canon.out[:0], req.Body)
	if err != nil {
		if errors.Is(err, ErrInvalidJSON) || errors.Is(err, ErrDuplicateName) || errors.Is(err, ErrRulePanicked) {
			return store.Fingerprint{}, err
		}
		return store.Fingerprint{}, &RuleError{Rule: r.id, Err: err}
	}
	if r.appends && cap(out) <= 4<<20 { // do not pool huge buffers, nor a custom rule's
		s.canon.out = out[:0]
	}
	e := append(s.enc[:0], versionPrefix(v1)...)
	e = append(e, 'S')
	e = appendField(e, r.id)
	e = appendField(e, req.Method)
	e = appendField(e, req.Route)
	e = s.appendQuery(e, req.RawQuery)
	if !v1 {
		// Version 2: the codings and the media type before the body (one write).
		e = appendMediaType(appendContentEncoding(e, req.ContentEncoding), req.ContentType)
	}
	e = binary.AppendUvarint(e, uint64(len(out)))
	s.h.Reset()
	s.h.Write(e)
	s.h.Write(out)
	if v1 {
		e = appendContentEncoding(e[:0], req.ContentEncoding)
		s.h.Write(e)
	}
	s.enc = e
	s.h.Sum(s.digest[:0])
	var fp store.Fingerprint
	copy(fp[:], r.tag[:])
	copy(fp[ruleTagLen:], s.digest[:])
	return fp, nil
}

// run applies the rule, containing a custom BodyFunc's panic (the JSON rules
// never panic: FuzzCanonicalJSON, TestRuleNeverPanics).
func (r *Rule) run(dst, body []byte) (out []byte, err error) {
	if r.appends {
		return r.apply(dst, body)
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("%w: rule %s: %v", ErrRulePanicked, r.id, p)
		}
	}()
	return r.apply(dst, body)
}

// parsePointers checks paths, returns them split into unescaped tokens, and the
// rule's ID: name followed by the sorted, deduplicated paths as a JSON array.
func parsePointers(name string, paths []string, rootOK bool) ([][]string, string, error) {
	if len(paths) == 0 {
		return nil, "", fmt.Errorf("%w: %s: no path", ErrInvalidRule, name)
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(paths)))
	ptrs := make([][]string, 0, len(sorted))
	for _, p := range sorted {
		toks, err := ParsePointer(p)
		if err != nil {
			return nil, "", fmt.Errorf("%w: %s: %w", ErrInvalidRule, name, err)
		}
		if len(toks) == 0 && !rootOK {
			return nil, "", fmt.Errorf("%w: %s: the path \"\" would ignore the whole body", ErrInvalidRule, name)
		}
		ptrs = append(ptrs, toks)
	}
	list, _ := json.Marshal(sorted) // strings: cannot fail
	return ptrs, name + string(list), nil
}

// ParsePointer splits a JSON Pointer (RFC 6901 section 3) into its reference
// tokens, unescaped ("~1" to '/', then "~0" to '~'): "" gives none, "/a~1b/0"
// gives "a/b" and "0". Errors: a pointer not starting with '/', or a '~' not
// followed by '0' or '1'.
func ParsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON Pointer %q does not start with '/' (RFC 6901 section 3)", p)
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 >= len(t) || t[j+1] != '0' && t[j+1] != '1') {
				return nil, fmt.Errorf("JSON Pointer %q: '~' not followed by '0' or '1' (RFC 6901 section 3)", p)
			}
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

// arrayIndex returns the array index a reference token names (RFC 6901 section
// 4: "0" or digits without a leading zero), or -1.
func arrayIndex(tok string) int {
	if tok == "" || len(tok) > 9 || len(tok) > 1 && tok[0] == '0' {
		return -1
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return -1
		}
		n = n*10 + int(tok[i]-'0')
	}
	return n
}
