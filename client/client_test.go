package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
)

// script is a test server answering each attempt with the next status of its
// list (the last one repeats) and recording what each attempt carried.
type script struct {
	mu       sync.Mutex
	statuses []int
	header   http.Header // set on every answer
	keys     []string
	bodies   []string
	hijack   int // attempts numbered up to this one get their connection closed unanswered
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, strings.Join(r.Header.Values("Idempotency-Key"), "|"))
	s.bodies = append(s.bodies, string(body))
	n := len(s.keys)
	status := s.statuses[min(n, len(s.statuses))-1]
	s.mu.Unlock()
	if n <= s.hijack {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the answer is lost
		}
		return
	}
	for k, v := range s.header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	fmt.Fprint(w, "status ", status)
}

func (s *script) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// newTransport returns a transport whose waits are recorded, not slept.
func newTransport(t *testing.T, opts ...Option) (*Transport, *[]time.Duration) {
	t.Helper()
	tr, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	tr.sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err()
	}
	return tr, &waits
}

func post(t *testing.T, tr http.RoundTripper, url string, body io.Reader, key string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest("POST", url, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return (&http.Client{Transport: tr}).Do(req)
}

var quotedUUIDv4 = regexp.MustCompile(`^"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"$`)

// TestRetryDecisions: which answers are retried, how often, after what wait,
// and that every attempt carries the same minted key and body bytes.
func TestRetryDecisions(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, 10 * time.Second
	date := time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		statuses   []int
		retryAfter string
		hijack     int
		attempts   int
		final      int
		minWait    time.Duration // of each wait
		maxWait    time.Duration
	}{
		{"201 is the answer", []int{201}, "", 0, 1, 201, 0, 0},
		{"500 retried", []int{500, 201}, "", 0, 2, 201, base / 2, base},
		{"502 and 504 retried with growing back-off", []int{502, 504, 201}, "", 0, 3, 201, base / 2, 2 * base},
		{"503 without Retry-After retried", []int{503, 201}, "", 0, 2, 201, base / 2, base},
		{"503 with Retry-After waits it", []int{503, 201}, "2", 0, 2, 201, 2 * time.Second, 2*time.Second + base},
		{"409 with Retry-After waits it", []int{409, 201}, "1", 0, 2, 201, time.Second, time.Second + base},
		{"Retry-After as an HTTP date", []int{503, 201}, date, 0, 2, 201, 3 * time.Second, 5*time.Second + base},
		{"409 without Retry-After is the answer", []int{409}, "", 0, 1, 409, 0, 0},
		{"Retry-After over the max delay ends retries", []int{503}, "3600", 0, 1, 503, 0, 0},
		{"422 never retried", []int{422}, "", 0, 1, 422, 0, 0},
		{"422 with Retry-After never retried", []int{422}, "1", 0, 1, 422, 0, 0},
		{"400 never retried", []int{400}, "", 0, 1, 400, 0, 0},
		{"404 never retried", []int{404}, "", 0, 1, 404, 0, 0},
		{"429 never retried", []int{429}, "1", 0, 1, 429, 0, 0},
		{"bounded: always 500 stops after 4 attempts", []int{500}, "", 0, 4, 500, base / 2, 4 * base},
		{"lost answers retried", []int{201}, "", 2, 3, 201, base / 2, 2 * base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{statuses: tc.statuses, hijack: tc.hijack}
			if tc.retryAfter != "" {
				s.header = http.Header{"Retry-After": {tc.retryAfter}}
			}
			srv := httptest.NewServer(s)
			defer srv.Close()
			tr, waits := newTransport(t, WithBackoff(base, maxDelay))
			// A body without GetBody: the transport must keep its bytes itself.
			resp, err := post(t, tr, srv.URL, io.MultiReader(strings.NewReader("amount="), strings.NewReader("100")), "")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.final || string(b) != fmt.Sprint("status ", tc.final) || s.attempts() != tc.attempts || len(*waits) != tc.attempts-1 {
				t.Fatalf("final %d %q after %d attempts and waits %v; want %d after %d", resp.StatusCode, b, s.attempts(), *waits, tc.final, tc.attempts)
			}
			for i, w := range *waits {
				if w < tc.minWait || w > tc.maxWait<<i && tc.retryAfter == "" || w > tc.maxWait && tc.retryAfter != "" {
					t.Errorf("wait %d is %v, want %v to %v (doubling per attempt without Retry-After)", i, w, tc.minWait, tc.maxWait)
				}
			}
			if !quotedUUIDv4.MatchString(s.keys[0]) {
				t.Errorf("minted key %q is not a quoted UUIDv4", s.keys[0])
			}
			for i := range s.keys {
				if s.keys[i] != s.keys[0] || s.bodies[i] != "amount=100" {
					t.Errorf("attempt %d sent key %q body %q; want %q and amount=100", i+1, s.keys[i], s.bodies[i], s.keys[0])
				}
			}
			if got := resp.Request.Header.Get("Idempotency-Key"); got != s.keys[0] {
				t.Errorf("resp.Request carries key %q, want %q", got, s.keys[0])
			}
		})
	}
}

// TestKeys: the caller's key is kept, each logical request gets its own minted
// key, the caller's request is not modified, and unprotected methods are sent
// once without a key.
func TestKeys(t *testing.T) {
	s := &script{statuses: []int{500, 201}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	tr, _ := newTransport(t)

	resp, err := post(t, tr, srv.URL, strings.NewReader("a"), `"mine"`)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fmt.Sprint(s.keys) != `["mine" "mine"]` {
		t.Errorf("caller's key: attempts sent %q", s.keys)
	}

	s.keys, s.statuses = nil, []int{201}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
	for range 2 {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if len(s.keys) != 2 || s.keys[0] == s.keys[1] || !quotedUUIDv4.MatchString(s.keys[1]) {
		t.Errorf("two logical requests sent keys %q, want two distinct UUIDv4", s.keys)
	}
	if len(req.Header) != 0 {
		t.Errorf("the caller's request was modified: %v", req.Header)
	}

	s.keys, s.statuses = nil, []int{500}
	get, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err = tr.RoundTrip(get)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fmt.Sprint(s.keys) != "[]" || resp.StatusCode != 500 {
		t.Errorf("GET: attempts with keys %q and status %d, want one keyless attempt", s.keys, resp.StatusCode)
	}
}

// TestContextEndsBackoff: a context cancelled while waiting ends the request
// at once with the context's error, and no further attempt is sent.
func TestContextEndsBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // the caller gives up while the first answer is on its way
		w.WriteHeader(500)
	}))
	defer srv.Close()
	tr, err := New(WithBackoff(time.Hour, time.Hour)) // the real wait
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.Canceled) || time.Since(start) > time.Minute {
		t.Fatalf("got %v, %v after %v; want context.Canceled at once", resp, err, time.Since(start))
	}
}

// TestAttemptTimeout: an attempt whose answer does not come within the attempt
// timeout is retried with the same key; the one that answers is returned.
func TestAttemptTimeout(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // then the server notices the client hanging up
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			select { // the first answer never comes: the client gives up on it
			case <-r.Context().Done():
			case <-done:
			}
			return
		}
		w.WriteHeader(201)
	}))
	defer srv.Close()
	defer close(done)
	tr, _ := newTransport(t, WithAttemptTimeout(500*time.Millisecond))
	resp, err := post(t, tr, srv.URL, strings.NewReader("x"), "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	// Two attempts, or more on a machine too loaded to answer within the timeout.
	if resp.StatusCode != 201 || len(keys) < 2 || strings.Count(strings.Join(keys, ""), keys[0]) != len(keys) {
		t.Errorf("status %d after attempts with keys %q, want 201 after 2 or more with one key", resp.StatusCode, keys)
	}
}

// TestTransportErrorAfterLastAttempt: the last attempt's error is returned,
// wrapped with the attempt count, and matches the transport's error.
func TestTransportErrorAfterLastAttempt(t *testing.T) {
	boom := errors.New("connection refused")
	calls := 0
	tr, _ := newTransport(t, WithMaxAttempts(3), WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls++
		return nil, boom
	})))
	req, _ := http.NewRequest("POST", "http://127.0.0.1:1/", strings.NewReader("x"))
	resp, err := tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, boom) || calls != 3 || !strings.Contains(err.Error(), "3 attempt") {
		t.Errorf("got %v, %v after %d calls; want the transport's error after 3", resp, err, calls)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNewRefusesMisconfiguration(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"nil base", WithBase(nil)},
		{"empty key header", WithKeyHeader("")},
		// The base transport would refuse every request with this header.
		{"key header with a space", WithKeyHeader("Idempotency Key")},
		{"zero attempts", WithMaxAttempts(0)},
		{"zero base delay", WithBackoff(0, time.Second)},
		{"max under base", WithBackoff(time.Second, time.Millisecond)},
		{"negative attempt timeout", WithAttemptTimeout(-1)},
		{"nil key func", WithKeyFunc(nil)},
	} {
		if _, err := New(tc.opt); err == nil {
			t.Errorf("%s: New succeeded", tc.name)
		}
	}
	if _, err := New(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	// No names is the default (as in the middleware and the gRPC interceptor).
	def, _ := New()
	none, err := New(WithMethods("PUT"), WithMethods())
	if err != nil || !reflect.DeepEqual(none.methods, def.methods) {
		t.Errorf("WithMethods(): %v, %v; want the defaults %v", none, err, def.methods)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999", 0, false},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		if got, ok := retryAfter(tc.in, now); got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if !quotedUUIDv4.MatchString(`"`+k+`"`) || seen[k] {
			t.Fatalf("key %q: not a UUIDv4 or repeated", k)
		}
		seen[k] = true
	}
}

// TestBodyClosedAndRewindFailure: the caller's body is closed (the
// RoundTripper contract), and a body that cannot be produced again ends the
// request without a retry.
func TestBodyClosedAndRewindFailure(t *testing.T) {
	s := &script{statuses: []int{500, 201}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	tr, _ := newTransport(t)
	body := &closeRecorder{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest("POST", srv.URL, body)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("x")), nil }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !body.closed || resp.StatusCode != 201 || fmt.Sprint(s.bodies) != "[x x]" {
		t.Errorf("closed %t, status %d, bodies %q", body.closed, resp.StatusCode, s.bodies)
	}

	s.keys, s.bodies = nil, nil
	gone := errors.New("spooled file removed")
	n := 0
	req, _ = http.NewRequest("POST", srv.URL, strings.NewReader("y"))
	req.GetBody = func() (io.ReadCloser, error) {
		if n++; n > 1 {
			return nil, gone
		}
		return io.NopCloser(strings.NewReader("y")), nil
	}
	resp, err = tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, gone) || s.attempts() != 1 {
		t.Errorf("got %v, %v after %d attempts; want the GetBody error after 1", resp, err, s.attempts())
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// A key func's key is sent as a Structured Field string the server parses back
// to the same key ('"' and '\' escaped); a key no server accepts is an error
// before anything is sent.
func TestKeyFuncKeys(t *testing.T) {
	for _, tc := range []struct {
		key, header string // header "" when refused
	}{
		{"order-1", `"order-1"`},
		{`a"b\c`, `"a\"b\\c"`},
		{" padded ", `" padded "`},
		{"", ""},
		{"   ", ""},
		{"ключ", ""},
		{"tab\there", ""},
		{strings.Repeat("k", 256), ""},
	} {
		sent := 0
		var got string
		tr, _ := newTransport(t, WithKeyFunc(func() string { return tc.key }), WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent++
			got = r.Header.Get(policy.DefaultKeyHeader)
			return &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Request: r}, nil
		})))
		resp, err := post(t, tr, "http://example.test/x", strings.NewReader("b"), "")
		if tc.header == "" {
			if err == nil || sent != 0 {
				t.Errorf("key %q: err %v after %d attempts, want an error before any", tc.key, err, sent)
			}
			continue
		}
		if err != nil {
			t.Fatalf("key %q: %v", tc.key, err)
		}
		resp.Body.Close()
		if back, perr := middleware.ParseKey(got); got != tc.header || perr != nil || back != tc.key {
			t.Errorf("key %q: header %s parsed back as %q (%v), want %s", tc.key, got, back, perr, tc.header)
		}
	}
}
