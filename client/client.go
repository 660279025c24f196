// Package client is the other half of idempotency: an http.RoundTripper that
// makes a write safe to retry by keeping one Idempotency-Key across every
// attempt of a logical request (IETF draft draft-ietf-httpapi-idempotency-key-header
// section 2; docs/architecture.md section 3 for what the server does with it).
//
// Clients lose keys in two ways: they mint a new key on each attempt (so the
// server runs the write again), or they retry a keyless write blindly. Transport
// does neither. For each request with a protected method (POST and PATCH by
// default) it:
//
//   - keeps the caller's Idempotency-Key, or mints one (a random UUIDv4, sent as
//     a Structured Field string) when the caller set none, and sends that same
//     key on every attempt;
//   - keeps a key the caller set under any spelling of the header's name
//     (req.Header["idempotency-key"] set directly is the same key);
//   - re-sends the same body bytes on every attempt (through Request.GetBody,
//     or a copy it reads once when the request has no GetBody, of at most
//     WithMaxBufferedBody bytes: a longer body without GetBody is streamed in
//     one attempt, never retried, and a transport error then wraps
//     ErrBodyNotRetried);
//   - retries on a transport error (connection refused or reset, an answer lost
//     on the way back, an attempt timeout), on 409 or 503 with Retry-After
//     (waiting that long), and on any other 5xx (exponential back-off with
//     jitter), at most MaxAttempts attempts in all, while the request's context
//     lives;
//   - never retries 422 (the key was used for another request) or any other
//     4xx: those are the answer, returned as is.
//
// Requests with other methods are sent once, unchanged. The key of a request is
// in the response's Request (resp.Request.Header), for logs and reconciliation.
// The last attempt's response or error is returned; an error is wrapped with
// the number of attempts and matches the transport's error with errors.Is/As.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/internal/httpfield"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// Defaults of the options.
const (
	// DefaultMaxAttempts is the number of attempts of one request, the first
	// included.
	DefaultMaxAttempts = 4
	// DefaultBaseDelay is the back-off before the second attempt; it doubles
	// for each further one (each wait jittered to between half and all of it).
	DefaultBaseDelay = 100 * time.Millisecond
	// DefaultMaxDelay is the longest single wait: the cap of the back-off, and
	// the longest Retry-After honoured (a longer one ends the retries and its
	// response is returned).
	DefaultMaxDelay = 10 * time.Second
	// DefaultMaxBufferedBody is the most bytes of a body without GetBody kept
	// in memory for the retries (4 MiB).
	DefaultMaxBufferedBody = 4 << 20
)

// ErrBodyNotRetried is wrapped by the error of a request that failed in its only
// attempt because its body, having no GetBody, was over the buffered-body limit
// (WithMaxBufferedBody) and so could not be sent again. Give such a request a
// GetBody (http.NewRequest does for a *bytes.Reader, *bytes.Buffer or
// *strings.Reader body) to have it retried.
var ErrBodyNotRetried = errors.New("idemkey/client: not retried: the request body has no GetBody and is over the buffered-body limit")

// errRewind wraps a failure of the request's GetBody: the body cannot be sent
// again, so the request is not retried.
var errRewind = errors.New("idemkey/client: rewinding the request body")

// drainLimit is how much of a retried response's body is read so its
// connection can be reused.
const drainLimit = 64 << 10

// Transport is an http.RoundTripper that keeps a request's idempotency key
// across its retries; see the package doc. Build it with New. Safe for
// concurrent use.
type Transport struct {
	base           http.RoundTripper
	keyHeader      string
	methods        map[string]bool
	maxAttempts    int
	baseDelay      time.Duration
	maxDelay       time.Duration
	attemptTimeout time.Duration
	maxBuffered    int64
	newKey         func() string
	// sleep waits d or until ctx is done; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// Option configures a Transport.
type Option func(*Transport)

// WithBase sets the transport that sends each attempt (default
// http.DefaultTransport).
func WithBase(rt http.RoundTripper) Option { return func(t *Transport) { t.base = rt } }

// WithKeyHeader sets the header carrying the key (default "Idempotency-Key").
func WithKeyHeader(name string) Option {
	return func(t *Transport) { t.keyHeader = textproto.CanonicalMIMEHeaderKey(name) }
}

// WithMethods sets the methods that get a key and retries. No names: the
// default, POST and PATCH, the methods the server middleware protects by
// default (as its WithMethods with no names).
func WithMethods(methods ...string) Option {
	return func(t *Transport) {
		if len(methods) == 0 {
			methods = []string{http.MethodPost, http.MethodPatch}
		}
		t.methods = map[string]bool{}
		for _, m := range methods {
			t.methods[m] = true
		}
	}
}

// WithMaxAttempts sets the number of attempts of one request, the first
// included (default 4; at least 1).
func WithMaxAttempts(n int) Option { return func(t *Transport) { t.maxAttempts = n } }

// WithBackoff sets the back-off before the second attempt and the longest
// single wait (defaults 100ms and 10s; base positive, max at least base). The
// back-off doubles per attempt up to max; each wait is jittered to between half
// and all of it. A Retry-After over max ends the retries.
func WithBackoff(base, max time.Duration) Option {
	return func(t *Transport) { t.baseDelay, t.maxDelay = base, max }
}

// WithAttemptTimeout bounds each attempt, from sending the request to the end of
// the response headers (default none: only the request's context bounds it).
// An attempt over it counts as a lost answer and is retried with the same key.
func WithAttemptTimeout(d time.Duration) Option { return func(t *Transport) { t.attemptTimeout = d } }

// WithMaxBufferedBody sets the most bytes of a request body without GetBody
// that the transport keeps in memory to send again (default
// DefaultMaxBufferedBody, 4 MiB; at least 0). A longer body is streamed in a
// single attempt, with the key, and not retried; a transport error of that
// attempt wraps ErrBodyNotRetried, and its answer, whatever the status, is
// returned as is.
func WithMaxBufferedBody(n int64) Option { return func(t *Transport) { t.maxBuffered = n } }

// WithKeyFunc sets how a key is minted for a request without one (default
// NewKey). It must return a different key on each call, of 1 to
// store.MaxKeyLen printable ASCII bytes ('"' and '\' are escaped); RoundTrip
// returns an error, sending nothing, for any other.
func WithKeyFunc(f func() string) Option { return func(t *Transport) { t.newKey = f } }

// New returns a Transport with the options applied. It fails on a key header
// name that is not a token (empty, with spaces or separators), fewer than one attempt, a non-positive base delay, a max
// delay under the base, a negative attempt timeout or buffered-body limit, or a
// nil base or key func.
func New(opts ...Option) (*Transport, error) {
	t := &Transport{
		base:        http.DefaultTransport,
		keyHeader:   policy.DefaultKeyHeader,
		methods:     map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		maxAttempts: DefaultMaxAttempts,
		baseDelay:   DefaultBaseDelay,
		maxDelay:    DefaultMaxDelay,
		maxBuffered: DefaultMaxBufferedBody,
		newKey:      NewKey,
		sleep:       sleep,
	}
	for _, o := range opts {
		o(t)
	}
	switch {
	case t.base == nil:
		return nil, errors.New("idemkey/client: nil base transport")
	case !httpfield.ValidName(t.keyHeader):
		// Every request would fail in the base transport instead.
		return nil, fmt.Errorf("idemkey/client: key header name %q is not a token (RFC 9110 section 5.1)", t.keyHeader)
	case t.maxAttempts < 1:
		return nil, fmt.Errorf("idemkey/client: %d attempts, want at least 1", t.maxAttempts)
	case t.baseDelay <= 0 || t.maxDelay < t.baseDelay:
		return nil, fmt.Errorf("idemkey/client: back-off base %v and max %v, want 0 < base <= max", t.baseDelay, t.maxDelay)
	case t.attemptTimeout < 0:
		return nil, fmt.Errorf("idemkey/client: negative attempt timeout %v", t.attemptTimeout)
	case t.maxBuffered < 0:
		return nil, fmt.Errorf("idemkey/client: negative buffered-body limit %d", t.maxBuffered)
	case t.newKey == nil:
		return nil, errors.New("idemkey/client: nil key func")
	}
	return t, nil
}

// NewKey returns a random UUIDv4 (RFC 9562 section 5.4) from crypto/rand, in
// its 36-character text form, e.g. "9b2c4f0e-7a51-4d0b-8f3e-2c6d1a7b9e40".
func NewKey() string {
	var u [16]byte
	rand.Read(u[:]) // never fails (crypto/rand.Read aborts the program instead)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hex[c>>4], hex[c&0x0f]
		j += 2
	}
	return string(b[:])
}

// keyField returns key as the Structured Field string the key header carries
// ('"' and '\' escaped), or an error, before anything is sent, for a key no
// server would accept: empty, only spaces, over store.MaxKeyLen bytes, or with a
// byte outside printable ASCII (RFC 8941 section 3.3.3).
func keyField(key string) (string, error) {
	if key == "" || len(key) > store.MaxKeyLen || strings.Trim(key, " ") == "" {
		return "", fmt.Errorf("idemkey/client: the key func returned %d bytes, want 1 to %d that are not all spaces", len(key), store.MaxKeyLen)
	}
	b := make([]byte, 0, len(key)+2)
	b = append(b, '"')
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("idemkey/client: the key func returned byte %#x at %d, want printable ASCII", c, i)
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"')), nil
}

// RoundTrip sends req, with its key and retries as the package doc says. It
// does not modify req: each attempt is a clone carrying the key.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.methods[req.Method] {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	getBody, once, err := bodySource(req, t.maxBuffered)
	if err != nil {
		return nil, err
	}
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	canonicalKey(header, t.keyHeader)
	if len(header[t.keyHeader]) == 0 {
		v, err := keyField(t.newKey())
		if err != nil {
			return nil, err
		}
		header[t.keyHeader] = []string{v}
	}
	for attempt := 1; ; attempt++ {
		resp, err := t.try(ctx, req, header, getBody)
		if once && err != nil {
			err = fmt.Errorf("%w (%d bytes): %w", ErrBodyNotRetried, t.maxBuffered, err)
		}
		if once || attempt == t.maxAttempts || errors.Is(err, errRewind) {
			return resp, wrap(err, attempt)
		}
		wait, retry := t.decide(resp, err, attempt)
		if !retry {
			return resp, wrap(err, attempt) // a final answer, even if the caller has just given up
		}
		if resp != nil {
			io.CopyN(io.Discard, resp.Body, drainLimit)
			resp.Body.Close()
		}
		if ctx.Err() != nil { // the caller gave up: no retry, its context's error
			return nil, wrap(ctx.Err(), attempt)
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, wrap(err, attempt)
		}
	}
}

func wrap(err error, attempts int) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("idemkey/client: %d attempt(s): %w", attempts, err)
}

// try sends one attempt: a clone of req with header and a fresh body.
func (t *Transport) try(ctx context.Context, req *http.Request, header http.Header, getBody func() (io.ReadCloser, error)) (*http.Response, error) {
	cancel := func() {}
	if t.attemptTimeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, t.attemptTimeout)
		cancel = stop
	}
	r := req.Clone(ctx)
	r.Header = header
	if getBody != nil {
		body, err := getBody()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("%w: %w", errRewind, err)
		}
		r.Body, r.GetBody = body, getBody
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		cancel()
		return nil, err
	}
	if t.attemptTimeout > 0 {
		// The timeout covers the headers; the body is the caller's to read.
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	}
	return resp, nil
}

// decide says whether an attempt's outcome is retried, and after what wait.
func (t *Transport) decide(resp *http.Response, err error, attempt int) (time.Duration, bool) {
	if err != nil {
		return t.backoff(attempt), true
	}
	s := resp.StatusCode
	switch {
	case s == http.StatusConflict || s == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			if d > t.maxDelay {
				return 0, false
			}
			// A little jitter spreads the retries of many clients told the same.
			return d + mathrand.N(t.baseDelay), true
		}
		if s == http.StatusConflict {
			return 0, false // a conflict of the application, not the key's lease
		}
		return t.backoff(attempt), true
	case s >= 500:
		return t.backoff(attempt), true
	}
	return 0, false
}

// backoff is the jittered wait after attempt n: base * 2^(n-1), capped at max,
// then a random point between half and all of it.
func (t *Transport) backoff(n int) time.Duration {
	d := t.maxDelay
	if n-1 < 32 {
		if e := t.baseDelay << (n - 1); e > 0 && e < d {
			d = e
		}
	}
	return d/2 + mathrand.N(d/2+1)
}

// retryAfter parses a Retry-After value (RFC 9110 section 10.2.3): whole
// seconds, or an HTTP date (a past date is 0).
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// canonicalKey moves the values of every spelling of name in h other than name
// itself (a key set as h["idempotency-key"]) under name, which must be
// canonical: the base transport sends them all as one field.
func canonicalKey(h http.Header, name string) {
	for k, v := range h {
		if k != name && strings.EqualFold(k, name) {
			h[name] = append(h[name], v...)
			delete(h, k)
		}
	}
}

// bodySource returns a function giving the request body afresh, or nil for a
// request without one. A body without GetBody is read into memory, up to limit
// bytes; a longer one can be given once only (once is true): the bytes read,
// then the rest of the caller's body.
func bodySource(req *http.Request, limit int64) (_ func() (io.ReadCloser, error), once bool, _ error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, false, nil
	}
	if req.GetBody != nil {
		// Every attempt sends a fresh copy; the caller's body is done with.
		req.Body.Close()
		return req.GetBody, false, nil
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("idemkey/client: reading the request body: %w", err)
	}
	if int64(len(b)) > limit {
		rest := struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), req.Body), req.Body}
		return func() (io.ReadCloser, error) { return rest, nil }, true, nil
	}
	req.Body.Close()
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, false, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancelBody ends an attempt's context when the caller closes the body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
