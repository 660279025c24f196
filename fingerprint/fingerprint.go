// Package fingerprint computes the fingerprint of an HTTP request: the SHA-256
// digest an idempotency store keeps with a key, so that a key reused for another
// request is recognised as a mismatch (docs/architecture.md section 3, "Fingerprint"; the IETF
// draft draft-ietf-httpapi-idempotency-key-header, section 2.7).
//
// The digest covers, in this order and each length-prefixed so that no two
// different inputs share an encoding:
//
//   - the method, as sent (methods are case-sensitive, RFC 9110 section 9.1);
//   - the route, as the caller names it (the middleware uses the URL path);
//   - the canonical query string: pairs split on '&' and at the first '=', keys and
//     values percent-decoded ('+' is a space; a malformed escape is kept as sent),
//     empty pairs dropped, "a" equal to "a=", sorted by key with a stable sort so
//     repeated parameters keep their order;
//   - the body: its raw bytes by default, or with [Options.CanonicalJSON] its
//     canonical JSON form (see [AppendCanonicalJSON]).
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
	// MaxBody is the body limit of FromRequest in bytes; 0 means DefaultMaxBody,
	// a negative value means no limit.
	MaxBody int64
}

// Request holds the parts of a request that the fingerprint covers.
type Request struct {
	// Method is the HTTP method, as sent.
	Method string
	// Route names the resource; the middleware passes the URL path. A key reused
	// on another route is a mismatch.
	Route string
	// RawQuery is the URL's query string without '?', as sent.
	RawQuery string
	// Body is the complete request body.
	Body []byte
}

// version prefixes every encoding; change it if the encoding ever changes.
const version = "idemkey/fingerprint/v1\x00"

// state holds the scratch buffers of one computation; pooled.
type state struct {
	h      hash.Hash
	enc    []byte // length-prefixed method, route, query
	dec    []byte // decoded query keys and values
	pairs  []pair
	canon  canonicalizer
	digest [sha256.Size]byte
}

type pair struct{ k0, k1, v0, v1 int } // offsets into state.dec

var statePool = sync.Pool{New: func() any { return &state{h: sha256.New()} }}

// Sum returns the fingerprint of req. The only error is a *JSONError (wrapping
// ErrInvalidJSON) when opts.CanonicalJSON is set and the body is not valid JSON.
// Sum does not modify or retain req.Body.
func Sum(req Request, opts Options) (store.Fingerprint, error) {
	s := statePool.Get().(*state)
	defer statePool.Put(s)
	body := req.Body
	mode := byte('r')
	if opts.CanonicalJSON && len(body) > 0 {
		out, err := s.canon.run(body)
		if err != nil {
			return store.Fingerprint{}, err
		}
		body, mode = out, 'j'
	}
	e := append(s.enc[:0], version...)
	e = append(e, mode)
	e = appendField(e, req.Method)
	e = appendField(e, req.Route)
	e = s.appendQuery(e, req.RawQuery)
	e = binary.AppendUvarint(e, uint64(len(body)))
	s.enc = e
	s.h.Reset()
	s.h.Write(e)
	s.h.Write(body)
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
// '%', '&', '=' and '+'. It shows the rule Sum hashes (Sum hashes a
// length-prefixed form, not this text).
func AppendCanonicalQuery(dst []byte, rawQuery string) []byte {
	s := statePool.Get().(*state)
	defer statePool.Put(s)
	s.collectQuery(rawQuery)
	for i, p := range s.pairs {
		if i > 0 {
			dst = append(dst, '&')
		}
		dst = appendQueryText(dst, s.dec[p.k0:p.k1])
		dst = append(dst, '=')
		dst = appendQueryText(dst, s.dec[p.v0:p.v1])
	}
	return dst
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

func appendField(e []byte, s string) []byte {
	e = binary.AppendUvarint(e, uint64(len(s)))
	return append(e, s...)
}

func (s *state) appendQuery(e []byte, rawQuery string) []byte {
	s.collectQuery(rawQuery)
	e = binary.AppendUvarint(e, uint64(len(s.pairs)))
	for _, p := range s.pairs {
		e = binary.AppendUvarint(e, uint64(p.k1-p.k0))
		e = append(e, s.dec[p.k0:p.k1]...)
		e = binary.AppendUvarint(e, uint64(p.v1-p.v0))
		e = append(e, s.dec[p.v0:p.v1]...)
	}
	return e
}

// collectQuery decodes rawQuery into s.dec and s.pairs, sorted by key (stable).
func (s *state) collectQuery(rawQuery string) {
	s.dec, s.pairs = s.dec[:0], s.pairs[:0]
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
		s.dec = appendUnescaped(s.dec, k)
		p.k1 = len(s.dec)
		p.v0 = p.k1
		s.dec = appendUnescaped(s.dec, v)
		p.v1 = len(s.dec)
		s.pairs = append(s.pairs, p)
	}
	dec := s.dec
	slices.SortStableFunc(s.pairs, func(a, b pair) int {
		return bytes.Compare(dec[a.k0:a.k1], dec[b.k0:b.k1])
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

// appendUnescaped appends the form-decoded s ('+' is a space, %XX a byte). A '%'
// not followed by two hex digits is kept as sent.
func appendUnescaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '+':
			dst = append(dst, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			dst = append(dst, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst
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
	return Sum(Request{Method: r.Method, Route: route, RawQuery: r.URL.RawQuery, Body: body}, opts)
}

type restoredBody struct {
	io.Reader
	io.Closer
}
