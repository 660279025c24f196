// Package fingerprint computes the fingerprint of an HTTP request: the SHA-256
// digest an idempotency store keeps with a key, so that a key reused for another
// request is recognised as a mismatch (docs/architecture.md section 3, "Fingerprint"; the IETF
// draft draft-ietf-httpapi-idempotency-key-header, section 2.7).
//
// The digest covers, in this order and each length-prefixed so that no two
// different inputs share an encoding:
//
//   - the method, as sent (methods are case-sensitive, RFC 9110 section 9.1);
//   - the route, as the caller names it. The middleware's default is the path as
//     the client sent it, percent-escapes included (url.URL.EscapedPath): two
//     requests a router could hand to different handlers must never share a
//     fingerprint, and routers differ in what they route by. A ServeMux splits
//     the path into segments at the slashes that were sent as slashes, so
//     /orders/7%2Fcancel reaches /orders/{id} with id "7/cancel" while
//     /orders/7/cancel reaches /orders/{id}/cancel; chi, and echo and gin with
//     their raw-path options, route by the escaped text itself. The decoded path
//     (url.URL.Path) makes both of those pairs one request, so it is not used.
//     The escaped path is taken byte for byte: /orders/%37 and /orders/7 reach
//     one ServeMux handler with the same id, yet differ here, because a router
//     matching the raw path (chi) sees two different ids. A client retries with
//     the bytes it sent the first time, so this costs nothing in practice; a
//     path with nothing escaped is named exactly as its URL.Path;
//   - the canonical query string: pairs split on '&' and at the first '=', keys and
//     values percent-decoded ('+' is a space), empty pairs dropped, "a" equal to
//     "a=", sorted by key with a stable sort so repeated parameters keep their
//     order. A key or value with a malformed escape ('%' not followed by two hex
//     digits) is not decoded at all: it is compared as sent and never equals a
//     decoded one, so "ms=%zz" and "ms=%25zz" differ. Two raw queries share a
//     canonical form only when every key and value decodes to the same bytes, or
//     is byte for byte the same malformed text;
//   - the body: its raw bytes by default, or with [Options.CanonicalJSON] its
//     canonical JSON form (see [AppendCanonicalJSON]), or under a [Rule]
//     ([Options.Rule]: [OnlyJSONFields], [IgnoreJSONFields], [NewRule]) the part
//     the rule keeps, behind the rule's identity;
//   - the Content-Encoding (see [Request]): a gzip body and its plain twin are
//     different requests;
//   - the Content-Type's media type, normalised (see [Request.ContentType]): the
//     same bytes sent as text/plain and as a form are read differently.
//
// The format has a version ([Options.Version]). Version 2, the default, covers
// the Content-Type; version 1 did not. A store compares fingerprints byte for
// byte, so a record stored under version 1 would be a mismatch for every
// request after an upgrade: the middleware judges such a record by version 1
// (docs/request-rules.md section 1, "Content-Type and the format version").
//
// A body read with [ReadBody] or [FromRequest] is read once, into one buffer, and
// never more than limit+1 bytes; a larger body is a [*TooLargeError] (the
// middleware answers 413).
package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/idemkey/idemkey/store"
)

// DefaultMaxBody is the default body limit in bytes (1 MiB): a larger request body
// is not fingerprinted and the middleware answers 413.
const DefaultMaxBody int64 = 1 << 20

// Errors; match with errors.Is.
var (
	// ErrBodyTooLarge is wrapped by *TooLargeError.
	ErrBodyTooLarge = errors.New("idemkey/fingerprint: request body too large")
	// ErrInvalidJSON is wrapped by *JSONError: the body is not one valid JSON
	// value (RFC 8259) although canonical JSON was asked for.
	ErrInvalidJSON = errors.New("idemkey/fingerprint: invalid JSON body")
)

// TooLargeError reports a body longer than Limit bytes. It wraps ErrBodyTooLarge.
type TooLargeError struct {
	// Limit is the limit that was exceeded, in bytes.
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("idemkey/fingerprint: request body larger than %d bytes", e.Limit)
}

// Unwrap returns ErrBodyTooLarge.
func (e *TooLargeError) Unwrap() error { return ErrBodyTooLarge }

// JSONError reports why a body is not valid JSON. It wraps ErrInvalidJSON.
type JSONError struct {
	// Offset is the byte offset in the body where the problem was found.
	Offset int
	// Reason says what was wrong, e.g. "unexpected byte '}'".
	Reason string
}

func (e *JSONError) Error() string {
	return fmt.Sprintf("idemkey/fingerprint: invalid JSON body at byte %d: %s", e.Offset, e.Reason)
}

// Unwrap returns ErrInvalidJSON.
func (e *JSONError) Unwrap() error { return ErrInvalidJSON }

// Options says how a body is fingerprinted.
type Options struct {
	// CanonicalJSON hashes the body's canonical JSON form (object members sorted by
	// key, insignificant whitespace removed, numbers, strings and array order
	// exactly as sent) instead of its raw bytes. An empty body is hashed as an
	// empty raw body. A body that is not valid JSON makes Sum fail with
	// ErrInvalidJSON; callers decide what to do (the middleware falls back to the
	// raw bytes).
	CanonicalJSON bool
	// Rule, when set, decides which part of the body is fingerprinted (see
	// Rule; CanonicalJSON is then ignored), and the fingerprint records the
	// rule's identity. A body the rule cannot read makes Sum fail (a *JSONError
	// for the JSON rules).
	Rule *Rule
	// MaxBody is the body limit of FromRequest in bytes; 0 means DefaultMaxBody,
	// a negative value means no limit.
	MaxBody int64
	// Version is the format version: 0 or 2 for the current one, 1 for the
	// format before the Content-Type counted (Request.ContentType is then
	// ignored), to judge records stored before an upgrade. Other values are
	// taken as 2.
	Version int
}

// Request holds the parts of a request that the fingerprint covers.
type Request struct {
	// Method is the HTTP method, as sent.
	Method string
	// Route names the resource; the middleware passes the path as sent
	// (url.URL.EscapedPath, see the package doc). A key reused on another route
	// is a mismatch.
	Route string
	// RawQuery is the URL's query string without '?', as sent.
	RawQuery string
	// Body is the complete request body, as sent (still encoded when
	// ContentEncoding is set).
	Body []byte
	// ContentEncoding is the request's Content-Encoding field value(s), joined by
	// ','; "" when absent. Coding names are case-insensitive (RFC 9110 section
	// 8.4.1) and spaces around the commas do not count, so "GZIP" equals "gzip".
	// Under version 1 an absent Content-Encoding left the digest as it was
	// before the field existed.
	ContentEncoding string
	// ContentType is the request's Content-Type field value ("" when absent;
	// see ContentType). Its media type counts normalised: type, subtype and
	// parameter names case-insensitive, parameters in any order, whitespace
	// around ';' and quotes around a value ignored, the charset's value
	// case-insensitive; every parameter counts, since charset changes how a text
	// or form body is read and boundary how a multipart body is split. A value
	// that is not a media type counts as sent. Ignored by version 1.
	ContentType string
}

// version and versionV1 prefix every encoding of their format; add a version if
// the encoding ever changes.
const (
	version   = "idemkey/fingerprint/v2\x00"
	versionV1 = "idemkey/fingerprint/v1\x00"
)

// state holds the scratch buffers of one computation; pooled.
type state struct {
	h      hash.Hash
	enc    []byte // length-prefixed method, route, query
	dec    []byte // decoded query keys and values
	pairs  []pair
	raw    bool // some key or value of the query is kept as sent
	canon  canonicalizer
	digest [sha256.Size]byte
}

// pair is one query parameter: offsets into state.dec; kRaw and vRaw are set
// when the key or value had a malformed escape and is kept as sent.
type pair struct {
	k0, k1, v0, v1 int
	kRaw, vRaw     bool
}

var statePool = sync.Pool{New: func() any { return &state{h: sha256.New()} }}

// Sum returns the fingerprint of req. Errors: a *JSONError (wrapping
// ErrInvalidJSON) when opts.CanonicalJSON is set, or opts.Rule is a JSON rule,
// and the body is not valid JSON; a custom rule's error (see BodyFunc).
// Sum does not modify or retain req.Body.
func Sum(req Request, opts Options) (store.Fingerprint, error) {
	s := statePool.Get().(*state)
	defer statePool.Put(s)
	if opts.Rule != nil {
		return opts.Rule.sum(s, req, opts.Version == 1)
	}
	body := req.Body
	mode := byte('r')
	if opts.CanonicalJSON && len(body) > 0 {
		out, err := s.canon.run(body)
		if err != nil {
			return store.Fingerprint{}, err
		}
		body, mode = out, 'j'
	}
	v1 := opts.Version == 1
	e := append(s.enc[:0], versionPrefix(v1)...)
	e = append(e, mode)
	e = appendField(e, req.Method)
	e = appendField(e, req.Route)
	e = s.appendQuery(e, req.RawQuery)
	if s.raw {
		// Queries with a component kept as sent use another mode byte, so the
		// digests of every other query stay as they were.
		e[len(version)] = mode - 'a' + 'A'
	}
	if !v1 {
		// Version 2: the codings and the media type before the length-prefixed
		// body, so the digest reads the header in one write.
		e = appendMediaType(appendContentEncoding(e, req.ContentEncoding), req.ContentType)
	}
	e = binary.AppendUvarint(e, uint64(len(body)))
	s.enc = e
	s.h.Reset()
	s.h.Write(e)
	s.h.Write(body)
	switch {
	case !v1:
	case req.ContentEncoding != "":
		// After the length-delimited body, so an absent encoding adds nothing.
		e = appendContentEncoding(e[:0], req.ContentEncoding)
		s.enc = e
		s.h.Write(e)
	}
	var fp store.Fingerprint
	s.h.Sum(s.digest[:0])
	fp = s.digest
	if cap(s.canon.out) > 4<<20 { // do not pool huge buffers
		s.canon = canonicalizer{}
	}
	return fp, nil
}

// AppendCanonicalQuery appends the canonical form of rawQuery to dst: the sorted,
// decoded pairs as "key=value" joined by '&', keys and values re-escaped only for
// '%', '&', '=' and '+'; a key or value with a malformed escape appears as sent.
// Two raw queries have the same canonical form exactly when Sum treats them as
// the same query. It shows the rule Sum hashes (Sum hashes a length-prefixed
// form, not this text).
func AppendCanonicalQuery(dst []byte, rawQuery string) []byte {
	s := statePool.Get().(*state)
	defer statePool.Put(s)
	s.collectQuery(rawQuery)
	for i, p := range s.pairs {
		if i > 0 {
			dst = append(dst, '&')
		}
		dst = appendComponentText(dst, s.dec[p.k0:p.k1], p.kRaw)
		dst = append(dst, '=')
		dst = appendComponentText(dst, s.dec[p.v0:p.v1], p.vRaw)
	}
	return dst
}

func appendComponentText(dst, b []byte, raw bool) []byte {
	if raw {
		return append(dst, b...)
	}
	return appendQueryText(dst, b)
}

// appendContentEncoding appends the length-prefixed normal form of a
// Content-Encoding value: lowercase, no spaces or tabs around the commas.
func appendContentEncoding(e []byte, ce string) []byte {
	n := 0
	for part := range strings.SplitSeq(ce, ",") {
		n += len(strings.Trim(part, " \t")) + 1
	}
	e = binary.AppendUvarint(e, uint64(n-1))
	first := true
	for part := range strings.SplitSeq(ce, ",") {
		if !first {
			e = append(e, ',')
		}
		first = false
		part = strings.Trim(part, " \t")
		for j := 0; j < len(part); j++ {
			c := part[j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			e = append(e, c)
		}
	}
	return e
}

func appendQueryText(dst, b []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range b {
		switch c {
		case '%', '&', '=', '+':
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func versionPrefix(v1 bool) string {
	if v1 {
		return versionV1
	}
	return version
}

func appendField(e []byte, s string) []byte {
	e = binary.AppendUvarint(e, uint64(len(s)))
	return append(e, s...)
}

func (s *state) appendQuery(e []byte, rawQuery string) []byte {
	s.collectQuery(rawQuery)
	e = binary.AppendUvarint(e, uint64(len(s.pairs)))
	for _, p := range s.pairs {
		e = s.appendComponent(e, p.k0, p.k1, p.kRaw)
		e = s.appendComponent(e, p.v0, p.v1, p.vRaw)
	}
	return e
}

// appendComponent appends one length-prefixed key or value; in a query with a
// component kept as sent, every component carries a flag byte saying which it is.
func (s *state) appendComponent(e []byte, from, to int, raw bool) []byte {
	if s.raw {
		flag := byte(0)
		if raw {
			flag = 1
		}
		e = append(e, flag)
	}
	e = binary.AppendUvarint(e, uint64(to-from))
	return append(e, s.dec[from:to]...)
}

// collectQuery decodes rawQuery into s.dec and s.pairs, sorted by key (stable;
// a decoded key before the same bytes kept as sent).
func (s *state) collectQuery(rawQuery string) {
	s.dec, s.pairs, s.raw = s.dec[:0], s.pairs[:0], false
	for rawQuery != "" {
		var part string
		if i := indexByte(rawQuery, '&'); i >= 0 {
			part, rawQuery = rawQuery[:i], rawQuery[i+1:]
		} else {
			part, rawQuery = rawQuery, ""
		}
		if part == "" {
			continue
		}
		k, v := part, ""
		if i := indexByte(part, '='); i >= 0 {
			k, v = part[:i], part[i+1:]
		}
		var p pair
		p.k0 = len(s.dec)
		s.dec, p.kRaw = appendUnescaped(s.dec, k)
		p.k1 = len(s.dec)
		p.v0 = p.k1
		s.dec, p.vRaw = appendUnescaped(s.dec, v)
		p.v1 = len(s.dec)
		s.raw = s.raw || p.kRaw || p.vRaw
		s.pairs = append(s.pairs, p)
	}
	dec := s.dec
	slices.SortStableFunc(s.pairs, func(a, b pair) int {
		if c := bytes.Compare(dec[a.k0:a.k1], dec[b.k0:b.k1]); c != 0 {
			return c
		}
		switch {
		case a.kRaw == b.kRaw:
			return 0
		case b.kRaw:
			return -1
		}
		return 1
	})
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// appendUnescaped appends the form-decoded s ('+' is a space, %XX a byte). If s
// has a '%' not followed by two hex digits, it appends s as sent instead and
// reports raw.
func appendUnescaped(dst []byte, s string) (_ []byte, raw bool) {
	if strings.IndexByte(s, '%') >= 0 {
		for i := 0; i < len(s); i++ {
			if s[i] == '%' {
				if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
					return append(dst, s...), true
				}
				i += 2
			}
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '+':
			dst = append(dst, ' ')
		case c == '%':
			dst = append(dst, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// ReadBody reads body to its end into buf's spare capacity (buf is reset to
// length 0 and grown as needed) and returns the bytes read. contentLength is the
// declared length (-1 when unknown); a declared length above limit fails at once
// without reading. At most limit+1 bytes are read: a longer body is a
// *TooLargeError, as is an *http.MaxBytesError from an outer limit. A negative
// limit means no limit. Other read errors are returned wrapped. A nil body or
// http.NoBody reads as empty.
func ReadBody(body io.Reader, contentLength, limit int64, buf []byte) ([]byte, error) {
	buf = buf[:0]
	if body == nil || body == http.NoBody {
		return buf, nil
	}
	if limit >= 0 && contentLength > limit {
		return buf, &TooLargeError{Limit: limit}
	}
	// One exact allocation: room for the declared bytes and the EOF probe. Without
	// a limit the declared length is the client's word only: trust it up to
	// DefaultMaxBody and grow past that as bytes arrive.
	if contentLength > 0 && (limit >= 0 || contentLength <= DefaultMaxBody) && int64(cap(buf)) < contentLength+1 {
		buf = make([]byte, 0, contentLength+1)
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(512, cap(buf)))
		}
		room := buf[len(buf):cap(buf)]
		if limit >= 0 && int64(len(room)) > limit+1-int64(len(buf)) {
			room = room[:limit+1-int64(len(buf))]
		}
		n, err := body.Read(room)
		buf = buf[:len(buf)+n]
		if limit >= 0 && int64(len(buf)) > limit {
			return buf, &TooLargeError{Limit: limit}
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return buf, &TooLargeError{Limit: mbe.Limit}
			}
			return buf, fmt.Errorf("idemkey/fingerprint: reading request body: %w", err)
		}
	}
}

// FromRequest reads r's body (at most opts.MaxBody bytes), puts back an
// equivalent body so that the next reader sees exactly the original bytes, and
// returns the fingerprint of r with the given route. Errors: *TooLargeError (the
// body is then restored as the bytes read followed by the unread rest), a
// *JSONError with opts.CanonicalJSON, or a read error.
func FromRequest(r *http.Request, route string, opts Options) (store.Fingerprint, error) {
	limit := opts.MaxBody
	if limit == 0 {
		limit = DefaultMaxBody
	}
	orig := r.Body
	body, err := ReadBody(orig, r.ContentLength, limit, nil)
	if orig != nil && orig != http.NoBody {
		r.Body = restoredBody{Reader: io.MultiReader(bytes.NewReader(body), orig), Closer: orig}
		if err == nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}
	}
	if err != nil {
		return store.Fingerprint{}, err
	}
	return Sum(Request{Method: r.Method, Route: route, RawQuery: r.URL.RawQuery, Body: body,
		ContentEncoding: ContentEncoding(r.Header), ContentType: ContentType(r.Header)}, opts)
}

// ContentEncoding returns h's Content-Encoding as Request.ContentEncoding takes
// it: "" when absent, the lines joined by ',' when sent in several.
func ContentEncoding(h http.Header) string { return joinedLines(h["Content-Encoding"]) }

// joinedLines is one header's lines as a single value: "" when absent, the
// lines joined by ',' when sent in several, without allocating for one line.
func joinedLines(v []string) string {
	switch len(v) {
	case 0:
		return ""
	case 1:
		return v[0]
	default:
		return strings.Join(v, ",")
	}
}

type restoredBody struct {
	io.Reader
	io.Closer
}
