package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func TestNewRequiresStoreAndScope(t *testing.T) {
	st := memory.New()
	tests := []struct {
		name  string
		st    store.Store
		scope ScopeFunc
		opts  []Option
	}{
		{"nil store", nil, GlobalScope, nil},
		{"nil scope", st, nil, nil},
		{"lease of 1ns", st, GlobalScope, []Option{WithLease(time.Nanosecond)}},
		{"lease under claim.MinLease", st, GlobalScope, []Option{WithLease(claim.MinLease - time.Millisecond)}},
		{"retention below lease", st, GlobalScope, []Option{WithLease(time.Minute), WithRecordRetention(policy.RetentionRule{Default: time.Second})}},
		{"negative body limit", st, GlobalScope, []Option{WithReplay(ReplayRule{MaxBody: -1})}},
		// No request carries it: every client would get a 400 for a missing key.
		{"key header with a space", st, GlobalScope, []Option{WithKey(policy.KeyRule{Header: "Idempotency Key"})}},
		{"replayed header with a colon", st, GlobalScope, []Option{WithReplay(ReplayRule{ReplayedHeader: "Replayed:"})}},
		{"key header with a colon", st, GlobalScope, []Option{WithKey(policy.KeyRule{Header: "Idempotency-Key:"})}},
		{"replayed header not a token", st, GlobalScope, []Option{WithReplay(ReplayRule{ReplayedHeader: "Replayed\r\nX"})}},
		{"omitted header not a token", st, GlobalScope, []Option{WithReplay(ReplayRule{OmittedHeader: "a b"})}},
		{"empty method", st, GlobalScope, []Option{WithMethods("POST", "")}},
		{"method with a space", st, GlobalScope, []Option{WithMethods("POST ")}},
		{"negative store timeout", st, GlobalScope, []Option{WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Complete: -time.Second}})}},
		{"renewal timeout over the lease", st, GlobalScope, []Option{WithLease(time.Second), WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Renew: 2 * time.Second}})}},
		{"negative request body limit", st, GlobalScope, []Option{WithRequestFingerprint(FingerprintRule{MaxBody: -1})}},
	}
	for _, tt := range tests {
		if m, err := New(tt.st, tt.scope, tt.opts...); err == nil || m != nil {
			t.Errorf("%s: New succeeded", tt.name)
		}
	}
	if _, err := New(st, GlobalScope); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, opts := range map[string][]Option{
		"claim.MinLease":           {WithLease(claim.MinLease)},
		"retention equal to lease": {WithLease(time.Minute), WithRecordRetention(policy.RetentionRule{Default: time.Minute})},
		"zero store timeouts":      {WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{}})},
		"renewal timeout = lease":  {WithLease(time.Second), WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Renew: time.Second}})},
		"custom header names":      {WithKey(policy.KeyRule{Header: "X-Idem-Key"}), WithReplay(ReplayRule{ReplayedHeader: "Idempotency-Replayed"})},
	} {
		if _, err := New(st, GlobalScope, opts...); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Row: method not protected -> pass through, key ignored.
func TestUnprotectedMethodPassesThrough(t *testing.T) {
	e := newEnv(t, echoHandler)
	for range 2 {
		for _, method := range []string{"GET", "PUT", "DELETE"} {
			w := e.do(req(method, "/x", "k1", "same"))
			if w.Code != http.StatusCreated || w.Header().Get(DefaultReplayedHeader) != "" {
				t.Fatalf("%s: %d %v", method, w.Code, w.Header())
			}
			if e.lastEvent().Decision != PassThrough {
				t.Fatalf("decision %v", e.lastEvent().Decision)
			}
		}
	}
	if e.calls.Load() != 6 || e.mem.Len() != 0 {
		t.Fatalf("calls %d, records %d", e.calls.Load(), e.mem.Len())
	}
}

func TestWithMethods(t *testing.T) {
	e := newEnv(t, echoHandler, WithMethods("PUT"))
	e.do(req("PUT", "/x", "k", "a"))
	if w := e.do(req("PUT", "/x", "k", "a")); w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatal("PUT not protected")
	}
	e.do(req("POST", "/x", "k", "a"))
	if e.calls.Load() != 2 {
		t.Fatalf("calls %d, want 2 (POST unprotected now)", e.calls.Load())
	}
}

// Row: key missing where required -> 400.
func TestKeyMissingRequired(t *testing.T) {
	e := newEnv(t, echoHandler)
	for _, method := range []string{"POST", "PATCH"} {
		w := e.do(req(method, "/x", "", "body"))
		checkProblem(t, w, http.StatusBadRequest, CodeKeyMissing)
	}
	if e.calls.Load() != 0 || e.lastEvent().Decision != KeyMissing {
		t.Fatalf("calls %d, decision %v", e.calls.Load(), e.lastEvent().Decision)
	}
}

// Row: key missing where optional -> pass through, nothing stored.
func TestKeyMissingOptional(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := KeyFromContext(r.Context()); ok {
			t.Error("key in context without a key")
		}
		echoHandler(w, r)
	}, WithKey(policy.KeyRule{Optional: true}))
	for range 2 {
		if w := e.do(req("POST", "/x", "", "body")); w.Code != http.StatusCreated || w.Body.String() != "body" {
			t.Fatalf("%d %q", w.Code, w.Body)
		}
	}
	if e.calls.Load() != 2 || e.mem.Len() != 0 || e.lastEvent().Decision != NoKey {
		t.Fatalf("calls %d, records %d", e.calls.Load(), e.mem.Len())
	}
}

// Row: invalid key -> 400.
func TestKeyInvalid(t *testing.T) {
	e := newEnv(t, echoHandler)
	long := strings.Repeat("k", 256)
	for _, tt := range []struct {
		name   string
		values []string
	}{
		{"empty", []string{""}},
		{"empty string item", []string{`""`}},
		{"a single space", []string{`" "`}},
		{"only spaces", []string{`"   "`}},
		{"over 255 bytes", []string{long}},
		{"over 255 bytes quoted", []string{`"` + long + `"`}},
		{"control character", []string{"ab\x01c"}},
		{"tab inside", []string{`"a` + "\t" + `b"`}},
		{"non-ASCII", []string{"clé"}},
		{"unterminated string", []string{`"abc`}},
		{"bad escape", []string{`"a\nb"`}},
		{"two keys in one line", []string{`"a", "b"`}},
		{"space inside token", []string{"a b"}},
		{"several header lines", []string{"a", "a"}},
		{"inner list", []string{`("a")`}},
	} {
		r := req("POST", "/x", "", "b")
		r.Header["Idempotency-Key"] = tt.values
		w := e.do(r)
		if w.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d", tt.name, w.Code)
			continue
		}
		checkProblem(t, w, http.StatusBadRequest, CodeKeyInvalid)
	}
	if e.calls.Load() != 0 || e.lastEvent().Decision != KeyInvalid {
		t.Fatalf("handler ran %d times", e.calls.Load())
	}
}

func TestParseKey(t *testing.T) {
	valid := []struct{ in, want string }{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{` "with space" `, "with space"},
		{`"esc\"aped\\"`, `esc"aped\`},
		{`"k";exp=1;x`, "k"},
		{`tok:en/1;a="b"`, "tok:en/1"},
		{`"` + strings.Repeat("a", 255) + `"`, strings.Repeat("a", 255)},
	}
	for _, tt := range valid {
		got, err := ParseKey(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", " ", `""`, `" "`, `"  "`, `"a`, `"a"b`, `a,b`, `"a";`, `"a";X=1`, `"a";x=`, "\x7f", `"é"`, strings.Repeat("a", 256)} {
		if _, err := ParseKey(in); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) error %v, want ErrInvalidKey", in, err)
		}
	}
}

// TestParseKeyTokenBytes checks every byte inside a bare key against the
// grammar (RFC 9110 tchar, ':' and '/'), so the bit table behind isKeyTokenChar
// cannot drift from it.
func TestParseKeyTokenBytes(t *testing.T) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		want := 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~:/", b) >= 0
		k, err := ParseKey("k" + string(b) + "k")
		if got := err == nil && k == "k"+string(b)+"k"; got != want {
			t.Errorf("byte %#x inside a bare key: accepted %v (%q, %v), want %v", b, got, k, err, want)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, "abc", `"a\"b"`, `"k";p=?1`, `"x`, "", "\x00", `"a";b=:AAA=:`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := ParseKey(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		if k == "" || len(k) > store.MaxKeyLen {
			t.Fatalf("accepted key of %d bytes", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted byte %#x", k[i])
			}
		}
		// The quoted form of an accepted key names the same key.
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := ParseKey(q); err != nil || k2 != k {
			t.Fatalf("quoted %q -> %q, %v", q, k2, err)
		}
	})
}

func TestQuotedAndBareKeyAreOneKey(t *testing.T) {
	e := newEnv(t, echoHandler)
	e.do(req("POST", "/x", `"quoted-key-1"`, "q"))
	w := e.do(req("POST", "/x", "quoted-key-1", "q"))
	if w.Header().Get(DefaultReplayedHeader) != "true" || e.calls.Load() != 1 {
		t.Fatalf("bare form not replayed: calls %d", e.calls.Load())
	}
}

func TestKeyHeaderConfigurable(t *testing.T) {
	e := newEnv(t, echoHandler, WithKey(policy.KeyRule{Header: "x-request-key"}))
	r := req("POST", "/x", "", "a", "X-Request-Key", "k")
	e.do(r)
	w := e.do(req("POST", "/x", "", "a", "X-Request-Key", "k"))
	if w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatal("custom key header not used")
	}
	checkProblem(t, e.do(req("POST", "/x", "k", "a")), http.StatusBadRequest, CodeKeyMissing)
}

// Row: body larger than the fingerprint limit -> 413.
func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{MaxBody: 10}))
	w := e.do(req("POST", "/x", "k", "0123456789A"))
	checkProblem(t, w, http.StatusRequestEntityTooLarge, CodeRequestTooLarge)
	r := req("POST", "/x", "k2", "0123456789A")
	r.ContentLength = -1 // unknown length: found while reading
	checkProblem(t, e.do(r), http.StatusRequestEntityTooLarge, CodeRequestTooLarge)
	if e.calls.Load() != 0 || e.mem.Len() != 0 || e.lastEvent().Decision != BodyTooLarge {
		t.Fatalf("calls %d records %d", e.calls.Load(), e.mem.Len())
	}
	if w := e.do(req("POST", "/x", "k", "0123456789")); w.Code != http.StatusCreated || w.Body.String() != "0123456789" {
		t.Fatalf("body at the limit: %d %q", w.Code, w.Body)
	}
}

func TestBodyUnreadable(t *testing.T) {
	e := newEnv(t, echoHandler)
	r := httptest.NewRequest("POST", "/x", io.MultiReader(strings.NewReader("part"), errReader{}))
	r.Header.Set("Idempotency-Key", "k")
	checkProblem(t, e.do(r), http.StatusBadRequest, CodeBodyUnreadable)
	if e.calls.Load() != 0 {
		t.Fatal("handler ran")
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// Row: new key -> claim, run once, store; the handler sees the exact body and the key.
func TestNewKeyRunsOnceWithBodyAndContext(t *testing.T) {
	body := "{\"a\": 1}\x00\xff binary"
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		id, ok := KeyFromContext(r.Context())
		if !ok || id != (store.ID{Scope: "tenant-7", Key: "k-new"}) {
			t.Errorf("KeyFromContext = %+v, %v", id, ok)
		}
		echoHandler(w, r)
	})
	w := e.do(req("POST", "/x", "k-new", body, "X-Client-ID", "tenant-7"))
	if w.Code != http.StatusCreated || w.Body.String() != body {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	if w.Header().Get(DefaultReplayedHeader) != "" {
		t.Fatal("original marked as replay")
	}
	ev := e.lastEvent()
	if ev.Decision != Executed || ev.Status != 201 || ev.ID.Key != "k-new" || ev.Takeover {
		t.Fatalf("event %+v", ev)
	}
	if e.st.completes.Load() != 1 {
		t.Fatal("not completed")
	}
}

// Row: same key, same fingerprint, completed -> replay.
func TestReplay(t *testing.T) {
	body := bytes.Repeat([]byte{0, 1, 2, 0xff}, 300)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Location", "/payments/1")
		h.Set("ETag", `"v1"`)
		h.Set("X-App", "mine")
		h.Add("Link", "<a>")
		h.Add("Link", "<b>")
		h.Set("Set-Cookie", "s=1")
		h.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
		h.Set("X-RateLimit-Remaining", "9")
		h.Set("RateLimit-Policy", "10;w=1")
		h.Set("Retry-After", "5")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		w.WriteHeader(http.StatusAccepted)
		w.Write(body[:100])
		w.Write(body[100:])
		h.Set("X-After-Commit", "not on the wire") // not sent, not replayed
	})
	outer := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id")) // set by outer middleware
		e.h.ServeHTTP(w, r)
	}
	first := httptest.NewRecorder()
	outer(first, req("POST", "/pay", "k", "req", "X-Request-Id", "r1"))
	w := httptest.NewRecorder()
	outer(w, req("POST", "/pay", "k", "req", "X-Request-Id", "r2"))
	if e.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", e.calls.Load())
	}
	if w.Code != http.StatusAccepted || !bytes.Equal(w.Body.Bytes(), body) || !bytes.Equal(first.Body.Bytes(), body) {
		t.Fatalf("replay %d, %d bytes", w.Code, w.Body.Len())
	}
	h := w.Header()
	for k, want := range map[string]string{
		"Content-Type": "application/octet-stream", "Location": "/payments/1", "Etag": `"v1"`, "X-App": "mine",
		DefaultReplayedHeader: "true", "X-Request-Id": "r2",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got := h.Values("Link"); len(got) != 2 || got[0] != "<a>" || got[1] != "<b>" {
		t.Errorf("Link = %q", got)
	}
	for _, k := range []string{"Set-Cookie", "Date", "X-Ratelimit-Remaining", "Ratelimit-Policy", "Retry-After",
		"Content-Length", "Connection", "X-Hop", "X-After-Commit", DefaultOmittedHeader} {
		if v, ok := h[k]; ok {
			t.Errorf("%s replayed: %q", k, v)
		}
	}
	if ev := e.lastEvent(); ev.Decision != Replayed || ev.Status != http.StatusAccepted {
		t.Fatalf("event %+v", ev)
	}
}

func TestReplayHeaderAllowAndDenyLists(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-App", "a")
		w.Header().Set("X-Secret", "s")
		w.Header().Set("Set-Cookie", "c=1")
		w.Write([]byte("ok"))
	}
	e := newEnv(t, handler, WithReplay(ReplayRule{Headers: []string{"Content-Type", "set-cookie"}}))
	e.do(req("POST", "/x", "k", ""))
	h := e.do(req("POST", "/x", "k", "")).Header()
	if h.Get("Content-Type") != "text/plain" || h.Get("X-App") != "" || h.Get("Set-Cookie") != "" {
		t.Fatalf("allow list: %v", h)
	}
	e = newEnv(t, handler, WithReplay(ReplayRule{DenyHeaders: []string{"x-secret"}}))
	e.do(req("POST", "/x", "k", ""))
	h = e.do(req("POST", "/x", "k", "")).Header()
	if h.Get("X-App") != "a" || h.Get("X-Secret") != "" {
		t.Fatalf("deny list: %v", h)
	}
}

func TestReplayedHeaderConfigurable(t *testing.T) {
	e := newEnv(t, echoHandler, WithReplay(ReplayRule{ReplayedHeader: "Idempotency-Replayed"}))
	first := e.do(req("POST", "/echo", "k", "r"))
	w := e.do(req("POST", "/echo", "k", "r"))
	if first.Header().Get("Idempotency-Replayed") != "" || w.Header().Get("Idempotency-Replayed") != "true" ||
		w.Header().Get(DefaultReplayedHeader) != "" {
		t.Fatalf("first %v, replay %v", first.Header(), w.Header())
	}
}

// Row: same key, same fingerprint, lease live -> 409 with Retry-After.
func TestInFlight409(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.Write([]byte("done"))
	}, WithLease(10*time.Second))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(req("POST", "/slow", "k", "s")) }()
	<-entered
	for _, tt := range []struct {
		advance time.Duration
		want    string
	}{
		{0, "10"},                      // full lease left
		{7500 * time.Millisecond, "2"}, // 2.5s left: rounded down, never past the lease
		{2400 * time.Millisecond, "1"}, // 0.1s left: at least 1
	} {
		e.now.Add(tt.advance)
		w := e.do(req("POST", "/slow", "k", "s"))
		checkProblem(t, w, http.StatusConflict, CodeInFlight)
		if got := w.Header().Get("Retry-After"); got != tt.want {
			t.Errorf("after +%v: Retry-After %q, want %q", tt.advance, got, tt.want)
		}
		if e.lastEvent().Decision != InFlight {
			t.Fatal(e.lastEvent())
		}
	}
	close(release)
	if w := <-done; w.Body.String() != "done" {
		t.Fatal(w.Body)
	}
	if e.calls.Load() != 1 {
		t.Fatalf("calls %d", e.calls.Load())
	}
}

// A 409's Retry-After estimates the remaining work from the route's recent
// handler durations (rounded up to whole seconds), at least 1 s and at most the
// rest of the lease; with no sample yet it is the rest of the lease.
func TestInFlightRetryAfterEstimate(t *testing.T) {
	for _, tc := range []struct {
		name string
		took time.Duration // the sample request's handler duration; 0: no sample
		want string
	}{
		{"no sample yet: the rest of the lease", 0, "10"},
		{"fast handler: at least 1 s", 100 * time.Millisecond, "1"},
		{"rounded up", 2500 * time.Millisecond, "3"},
		{"never past the rest of the lease", 30 * time.Second, "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh middleware per case: its estimate has no other route's samples.
			var e *env
			hold, entered := make(chan struct{}), make(chan struct{})
			e = newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Hold") != "" {
					entered <- struct{}{}
					<-hold
					return
				}
				e.clk.advance(tc.took) // the work, on the middleware's clock
			}, WithLease(10*time.Second))
			if tc.took > 0 {
				if w := e.do(req("POST", "/work", "sample", "")); w.Code != http.StatusOK {
					t.Fatalf("sample request: %d", w.Code)
				}
			}
			done := make(chan struct{})
			go func() { e.do(req("POST", "/work", "held", "", "X-Hold", "1")); close(done) }()
			<-entered
			w := e.do(req("POST", "/work", "held", "", "X-Hold", "1"))
			close(hold)
			<-done
			checkProblem(t, w, http.StatusConflict, CodeInFlight)
			if got := w.Header().Get("Retry-After"); got != tc.want {
				t.Errorf("after a %v handler: Retry-After %q, want %q", tc.took, got, tc.want)
			}
		})
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, time.Millisecond: 1, time.Second: 1, 1999 * time.Millisecond: 1, 2 * time.Second: 2, 10 * time.Second: 10} {
		if got := retryAfterSeconds(d); got != want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// Row: same key, different fingerprint -> 422; the record is untouched.
func TestMismatch422(t *testing.T) {
	e := newEnv(t, echoHandler)
	e.do(req("POST", "/a?x=1", "k", "payload-a"))
	for _, r := range []*http.Request{
		req("POST", "/a?x=1", "k", "payload-b"),                             // body
		req("POST", "/b?x=1", "k", "payload-a"),                             // route
		req("POST", "/a?x=2", "k", "payload-a"),                             // query
		req("PATCH", "/a?x=1", "k", "payload-a"),                            // method
		req("POST", "/a?x=1", "k", "payload-a", "Content-Encoding", "gzip"), // encoding
	} {
		checkProblem(t, e.do(r), http.StatusUnprocessableEntity, CodeMismatch)
		if e.lastEvent().Decision != Mismatch {
			t.Fatal(e.lastEvent())
		}
	}
	w := e.do(req("POST", "/a?x=1", "k", "payload-a"))
	if w.Body.String() != "payload-a" || w.Header().Get(DefaultReplayedHeader) != "true" || e.calls.Load() != 1 {
		t.Fatalf("original not replayed after mismatches: %q calls %d", w.Body, e.calls.Load())
	}
}

// Two queries that differ only in a malformed escape and its escaped twin are
// different requests: the second is a mismatch, not a replay of the first.
func TestMalformedQueryEscapeIsNotItsEscapedTwin(t *testing.T) {
	e := newEnv(t, echoHandler)
	e.do(req("POST", "/slow?ms=%zz&ms=50", "k", ""))
	checkProblem(t, e.do(req("POST", "/slow?ms=%25zz&ms=50", "k", "")), http.StatusUnprocessableEntity, CodeMismatch)
	if w := e.do(req("POST", "/slow?ms=%zz&ms=50", "k", "")); w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("the same raw query was not replayed: %d", w.Code)
	}
}

func TestMismatchAgainstInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})
	go e.do(req("POST", "/x", "k", "a"))
	<-entered
	checkProblem(t, e.do(req("POST", "/x", "k", "b")), http.StatusUnprocessableEntity, CodeMismatch)
	close(release)
}

func TestCanonicalJSONOption(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !json_valid(b) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Write(b)
	}, WithRequestFingerprint(FingerprintRule{CanonicalJSON: true}))
	first := e.do(req("POST", "/j", "k", `{"a":1,"b":[1,2]}`))
	w := e.do(req("POST", "/j", "k", "{ \"b\": [1,2],\n \"a\": 1 }"))
	if w.Header().Get(DefaultReplayedHeader) != "true" || w.Body.String() != first.Body.String() {
		t.Fatalf("reordered JSON not replayed: %d %q", w.Code, w.Body)
	}
	checkProblem(t, e.do(req("POST", "/j", "k", `{"a":1,"b":[2,1]}`)), http.StatusUnprocessableEntity, CodeMismatch)
	// Invalid JSON is fingerprinted raw: the handler's 400 is stored and replayed.
	if w := e.do(req("POST", "/j", "bad", `{"a":`)); w.Code != http.StatusBadRequest {
		t.Fatalf("invalid JSON: %d", w.Code)
	}
	if w := e.do(req("POST", "/j", "bad", `{"a":`)); w.Code != http.StatusBadRequest || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("invalid JSON retry: %d", w.Code)
	}
	checkProblem(t, e.do(req("POST", "/j", "bad", `{"a": `)), http.StatusUnprocessableEntity, CodeMismatch)
}

func json_valid(b []byte) bool {
	_, err := fingerprint.AppendCanonicalJSON(nil, b)
	return err == nil
}

// claimAsDeadHolder claims the key as a holder that will never finish.
func (e *env) claimAsDeadHolder(method, path, body, key string) store.Token {
	e.t.Helper()
	fp, err := fingerprint.Sum(fingerprint.Request{Method: method, Route: path, Body: []byte(body)}, fingerprint.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := e.mem.Claim(context.Background(), store.ClaimRequest{
		ID: store.ID{Scope: "anonymous", Key: key}, Fingerprint: fp, Lease: claim.DefaultLease, Retention: claim.DefaultRetention})
	if err != nil || res.Outcome != store.Claimed {
		e.t.Fatalf("claim: %+v %v", res, err)
	}
	return res.Token
}

// Row: same key, lease expired -> takeover, run once more; the stale holder's
// completion is refused.
func TestTakeoverAfterLeaseExpiry(t *testing.T) {
	e := newEnv(t, echoHandler)
	stale := e.claimAsDeadHolder("POST", "/x", "b", "k")
	checkProblem(t, e.do(req("POST", "/x", "k", "b")), http.StatusConflict, CodeInFlight)
	e.now.Add(claim.DefaultLease + time.Millisecond)
	w := e.do(req("POST", "/x", "k", "b"))
	if w.Code != http.StatusCreated || e.calls.Load() != 1 {
		t.Fatalf("takeover: %d calls %d", w.Code, e.calls.Load())
	}
	if ev := e.lastEvent(); ev.Decision != Executed || !ev.Takeover {
		t.Fatalf("event %+v", ev)
	}
	id := store.ID{Scope: "anonymous", Key: "k"}
	if err := e.mem.Complete(context.Background(), id, stale, store.Response{Status: 500}, time.Hour); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale complete: %v", err)
	}
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusCreated || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("replay after takeover: %d", w.Code)
	}
}

// Row: a stale holder completes after its lease was taken over -> refused, logged,
// the new holder's result is the one replayed.
func TestStaleHolderCompletionRefused(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	entered, release := make(chan struct{}), make(chan struct{})
	var n int
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			entered <- struct{}{}
			<-release
			w.Write([]byte("stale"))
			return
		}
		w.Write([]byte("fresh"))
	}, WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs, mu: &mu}, nil))))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(req("POST", "/x", "k", "b")) }()
	<-entered
	e.now.Add(claim.DefaultLease + time.Second)
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "fresh" {
		t.Fatalf("takeover answered %q", w.Body)
	}
	close(release)
	if w := <-done; w.Body.String() != "stale" {
		t.Fatalf("stale holder's live response %q", w.Body)
	}
	if ev := e.lastEvent(); ev.Decision != LeaseLost || !errors.Is(ev.Err, store.ErrLeaseLost) {
		t.Fatalf("event %+v", ev)
	}
	mu.Lock()
	logged := logs.String()
	mu.Unlock()
	if !strings.Contains(logged, "lease lost") {
		t.Fatalf("not logged: %q", logged)
	}
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "fresh" {
		t.Fatalf("replayed %q, want the new holder's", w.Body)
	}
}

type syncWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Rows: release on 5xx, 408, 409, 425, 429; store 2xx, 3xx, other 4xx.
func TestReleaseAndStoreRule(t *testing.T) {
	for _, tt := range []struct {
		status  int
		release bool
	}{
		{200, false}, {201, false}, {204, false}, {302, false}, {400, false}, {404, false}, {410, false}, {422, false},
		{408, true}, {409, true}, {425, true}, {429, true}, {500, true}, {502, true}, {503, true}, {599, true},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				fmt.Fprintf(w, "status:%d", tt.status)
			})
			first := e.do(req("POST", "/s", "k", "b"))
			w := e.do(req("POST", "/s", "k", "b"))
			if first.Code != tt.status || w.Code != tt.status {
				t.Fatalf("codes %d %d", first.Code, w.Code)
			}
			wantCalls, wantDecision := int32(1), Replayed
			if tt.release {
				wantCalls, wantDecision = 2, Released
			}
			if e.calls.Load() != wantCalls || e.lastEvent().Decision != wantDecision {
				t.Fatalf("calls %d, decision %v", e.calls.Load(), e.lastEvent().Decision)
			}
			wantBody := first.Body.String()
			if tt.status == 204 {
				wantBody = "" // the live response carried no body (ErrBodyNotAllowed)
			}
			if !tt.release && w.Body.String() != wantBody {
				t.Fatalf("replayed body %q", w.Body)
			}
		})
	}
}

func TestReleaseOption(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) },
		WithRelease(ReleaseRule{Status: func(status int) bool { return status == 404 }}))
	e.do(req("POST", "/s", "k", "b"))
	e.do(req("POST", "/s", "k", "b"))
	if e.calls.Load() != 2 {
		t.Fatalf("calls %d", e.calls.Load())
	}
}

// Row: the handler panics -> release, then re-panic.
func TestPanicReleasesAndRepanics(t *testing.T) {
	boom := true
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if boom {
			panic("boom")
		}
		w.Write([]byte("ok"))
	})
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v", p)
			}
		}()
		e.do(req("POST", "/p", "k", "b"))
	}()
	if e.st.releases.Load() != 1 || e.lastEvent().Decision != Released {
		t.Fatalf("releases %d, event %+v", e.st.releases.Load(), e.lastEvent())
	}
	if n, _ := e.clk.armed(); n != 0 {
		t.Fatal("renewal still scheduled after panic")
	}
	boom = false
	if w := e.do(req("POST", "/p", "k", "b")); w.Body.String() != "ok" || e.calls.Load() != 2 {
		t.Fatalf("retry after panic: %q calls %d", w.Body, e.calls.Load())
	}
}

func TestHandlerWritingNothingStores200(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {})
	e.do(req("POST", "/n", "k", ""))
	w := e.do(req("POST", "/n", "k", ""))
	if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get(DefaultReplayedHeader) != "true" || e.calls.Load() != 1 {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
}

func TestInformationalStatusNotStored(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("made"))
	})
	srv := httptest.NewServer(e.h) // a real server: the recorder takes 103 as final
	defer srv.Close()
	for range 2 {
		r, _ := http.NewRequest("POST", srv.URL+"/i", nil)
		r.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "made" {
			t.Fatalf("%d %q", resp.StatusCode, b)
		}
	}
	if e.calls.Load() != 1 {
		t.Fatalf("calls %d", e.calls.Load())
	}
}

// Row: response body over the storage cap -> streamed untouched, stored omitted.
func TestResponseOverCapStoredOmitted(t *testing.T) {
	const limit = 1 << 20
	big := bytes.Repeat([]byte("x"), limit+1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		for off := 0; off < len(big); off += 4096 {
			w.Write(big[off:min(off+4096, len(big))])
		}
	})
	first := e.do(req("POST", "/large", "k", "l"))
	if first.Body.Len() != limit+1 || first.Header().Get(DefaultOmittedHeader) != "" {
		t.Fatalf("live body %d bytes", first.Body.Len())
	}
	w := e.do(req("POST", "/large", "k", "l"))
	if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get(DefaultReplayedHeader) != "true" ||
		w.Header().Get(DefaultOmittedHeader) != "omitted" || w.Header().Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("replay %d, %d bytes, %v", w.Code, w.Body.Len(), w.Header())
	}
	if e.calls.Load() != 1 {
		t.Fatal("ran twice")
	}
	// Exactly at the cap the body is kept.
	e2 := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.Write(big[:limit]) })
	e2.do(req("POST", "/large", "k", "l"))
	if w := e2.do(req("POST", "/large", "k", "l")); w.Body.Len() != limit || w.Header().Get(DefaultOmittedHeader) != "" {
		t.Fatalf("at the cap: %d bytes", w.Body.Len())
	}
}

func TestStorageCapOption(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("12345")) }, WithReplay(ReplayRule{MaxBody: 4}))
	e.do(req("POST", "/c", "k", ""))
	if w := e.do(req("POST", "/c", "k", "")); w.Body.Len() != 0 || w.Header().Get(DefaultOmittedHeader) != "omitted" {
		t.Fatalf("%q", w.Body)
	}
}

// Row: store unreachable -> 503 with Retry-After (fail closed).
func TestStoreErrorFailsClosed(t *testing.T) {
	e := newEnv(t, echoHandler, WithStoreFailure(policy.StoreFailureRule{RetryAfter: 2500 * time.Millisecond}))
	e.st.claimErr = errors.New("connection refused")
	w := e.do(req("POST", "/x", "k", "b"))
	checkProblem(t, w, http.StatusServiceUnavailable, CodeStoreUnavailable)
	if w.Header().Get("Retry-After") != "2" || e.calls.Load() != 0 {
		t.Fatalf("Retry-After %q calls %d", w.Header().Get("Retry-After"), e.calls.Load())
	}
	if ev := e.lastEvent(); ev.Decision != StoreError || ev.Err == nil {
		t.Fatalf("event %+v", ev)
	}
	e.st.claimErr = fmt.Errorf("decode: %w", store.ErrCorrupt)
	checkProblem(t, e.do(req("POST", "/x", "k", "b")), http.StatusServiceUnavailable, CodeStoreUnavailable)
}

// A store that refuses the request's scope and key as arguments (store.ErrInvalid)
// reports a client mistake: 400, never 503, also when failing open.
func TestStoreRefusesKey(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		e := newEnv(t, echoHandler, WithStoreFailure(policy.StoreFailureRule{FailOpen: failOpen}))
		e.st.claimErr = fmt.Errorf("postgres: %w: scope and key over 2048 bytes", store.ErrInvalid)
		w := e.do(req("POST", "/x", "k", "b"))
		checkProblem(t, w, http.StatusBadRequest, CodeKeyInvalid)
		if e.calls.Load() != 0 || w.Header().Get("Retry-After") != "" {
			t.Fatalf("fail open %v: calls %d, Retry-After %q", failOpen, e.calls.Load(), w.Header().Get("Retry-After"))
		}
		if ev := e.lastEvent(); ev.Decision != KeyInvalid || !errors.Is(ev.Err, store.ErrInvalid) {
			t.Fatalf("event %+v", ev)
		}
	}
}

// logRecorder keeps every log record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.records = append(l.records, r)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level or above were logged, and the
// attribute name of the last of them, if any.
func (l *logRecorder) count(level slog.Level) (n int, last slog.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if r.Level >= level {
			n, last = n+1, r
		}
	}
	return n, last
}

func attr(r slog.Record, name string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == name {
			v = a.Value.String()
		}
		return true
	})
	return v
}

// A store outage is logged once when it starts, with a count every minute while
// it lasts, and once when it ends; each refused request only at debug level.
func TestStoreOutageLoggedOnce(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		logs := &logRecorder{}
		e := newEnv(t, echoHandler, WithLogger(slog.New(logs)), WithStoreFailure(policy.StoreFailureRule{FailOpen: failOpen}))
		level := slog.LevelError
		if failOpen {
			level = slog.LevelWarn
		}
		e.st.claimErr = errors.New("connection refused")
		for i := range 100 {
			e.do(req("POST", "/x", fmt.Sprint("k", i), "b"))
		}
		if n, r := logs.count(level); n != 1 || !strings.Contains(r.Message, "failed") {
			t.Fatalf("fail open %v: %d lines at %v or above for 100 refused requests, want 1 (%q)", failOpen, n, level, r.Message)
		}
		if n, _ := logs.count(slog.LevelDebug); n != 101 {
			t.Fatalf("fail open %v: %d lines in all, want the start and 100 at debug", failOpen, n)
		}
		e.clk.advance(time.Minute)
		e.do(req("POST", "/x", "one-more", "b"))
		if n, r := logs.count(level); n != 2 || attr(r, "failed_requests") != "101" {
			t.Fatalf("fail open %v: after a minute %d lines, last %q failed_requests=%s; want a summary of 101", failOpen, n, r.Message, attr(r, "failed_requests"))
		}
		e.st.claimErr = nil
		e.clk.advance(outageQuiet)
		e.do(req("POST", "/x", "back", "b"))
		e.do(req("POST", "/x", "back-2", "b"))
		n, r := logs.count(slog.LevelWarn)
		if n != 3 || !strings.Contains(r.Message, "available again") || attr(r, "failed_requests") != "101" {
			t.Fatalf("fail open %v: recovery: %d lines, last %q failed_requests=%s", failOpen, n, r.Message, attr(r, "failed_requests"))
		}
	}
}

// A store that fails every other claim is one outage: its start is logged
// once, and its end only after the store has answered for outageQuiet without
// a failure.
func TestFlappingStoreIsOneOutage(t *testing.T) {
	logs := &logRecorder{}
	e := newEnv(t, echoHandler, WithLogger(slog.New(logs)))
	for i := range 100 {
		e.st.claimErr = nil
		if i%2 == 0 {
			e.st.claimErr = errors.New("connection reset")
		}
		e.do(req("POST", "/x", fmt.Sprint("k", i), "b"))
		e.clk.advance(10 * time.Millisecond)
	}
	if n, r := logs.count(slog.LevelWarn); n != 1 || !strings.Contains(r.Message, "failed") {
		t.Fatalf("%d lines at warn or above for 50 failures among 100 claims, want the start only (last %q)", n, r.Message)
	}
	e.clk.advance(outageQuiet)
	e.st.claimErr = nil
	e.do(req("POST", "/x", "back", "b"))
	n, r := logs.count(slog.LevelWarn)
	if n != 2 || !strings.Contains(r.Message, "available again") || attr(r, "failed_requests") != "50" {
		t.Fatalf("after a quiet period: %d lines, last %q failed_requests=%s; want the end with 50", n, r.Message, attr(r, "failed_requests"))
	}
}

// The outage's logged length runs from its first failure to the answer that
// ended it: a store that hung through one request's claim and answered the next
// one 18 s later was down 18 s, not 0 s.
func TestOutageLengthLogged(t *testing.T) {
	logs := &logRecorder{}
	e := newEnv(t, echoHandler, WithLogger(slog.New(logs)))
	e.st.claimErr = fmt.Errorf("store: %w", context.DeadlineExceeded)
	e.do(req("POST", "/x", "hung", "b"))
	e.st.claimErr = nil
	e.clk.advance(18 * time.Second)
	e.do(req("POST", "/x", "back", "b"))
	n, r := logs.count(slog.LevelWarn)
	if n != 2 || !strings.Contains(r.Message, "available again") || attr(r, "outage") != "18s" {
		t.Fatalf("%d lines, last %q outage=%s; want the end logged with outage=18s", n, r.Message, attr(r, "outage"))
	}
}

// A claim that fails because the client went away (its request context
// cancelled) is no store outage: nothing is logged above debug level, and the
// next answered claim logs no recovery either.
func TestClientCancelIsNoOutage(t *testing.T) {
	logs := &logRecorder{}
	e := newEnv(t, echoHandler, WithLogger(slog.New(logs)))
	e.st.claimErr = fmt.Errorf("store: %w", context.Canceled)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e.do(req("POST", "/x", "gone", "b").WithContext(ctx))
	e.st.claimErr = nil
	e.do(req("POST", "/x", "next", "b"))
	if n, r := logs.count(slog.LevelInfo); n != 0 {
		t.Fatalf("%d lines above debug for a client that hung up, last %q", n, r.Message)
	}
	// A request whose deadline passed while the store hung is counted.
	e.st.claimErr = fmt.Errorf("store: %w", context.DeadlineExceeded)
	ctx, cancel = context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	e.do(req("POST", "/x", "late", "b").WithContext(ctx))
	if n, r := logs.count(slog.LevelError); n != 1 || !strings.Contains(r.Message, "failed") {
		t.Fatalf("%d error lines for a store past the deadline, want 1 (%q)", n, r.Message)
	}
}

func TestStoreErrorFailOpen(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if id, ok := KeyFromContext(r.Context()); !ok || id.Key != "k" {
			t.Error("key missing in fail-open context")
		}
		echoHandler(w, r)
	}, WithStoreFailure(policy.StoreFailureRule{FailOpen: true}))
	e.st.claimErr = errors.New("timeout")
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusCreated || w.Body.String() != "b" {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	if ev := e.lastEvent(); ev.Decision != FailOpen || ev.Status != http.StatusCreated {
		t.Fatalf("event %+v", ev)
	}
}

// waitArmed yields until n timers are armed on e's clock (the background
// completion schedules its back-offs and renewals on it).
func (e *env) waitArmed(n int) {
	for {
		if got, _ := e.clk.armed(); got == n {
			return
		}
		runtime.Gosched()
	}
}

// A failed completion does not hold the client: the request ends after the one
// attempt with the handler's response, and the completion is retried in the
// background while the lease is held: duplicates meanwhile get 409, never a
// second execution, and the replay is the original response.
func TestCompleteRetriedWhileLeaseHeld(t *testing.T) {
	e := newEnv(t, echoHandler)
	e.st.completeFails.Store(2)
	if w := e.do(req("POST", "/x", "k", "original")); w.Code != http.StatusCreated || w.Body.String() != "original" {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	if ev := e.lastEvent(); ev.Decision != Executed || ev.Err == nil || !ev.CompletionPending || e.st.completes.Load() != 1 {
		t.Fatalf("event %+v after %d Complete calls; want executed, completion pending after one", ev, e.st.completes.Load())
	}
	for retries := 0; retries < 2; retries++ {
		e.waitArmed(2) // the renewal and a back-off (the attempt before it failed)
		if w := e.do(req("POST", "/x", "k", "original")); w.Code != http.StatusConflict {
			t.Fatalf("duplicate during the retries: %d %q, want 409", w.Code, w.Body)
		}
		e.clk.fire()
	}
	e.waitArmed(0) // completed: the renewals stopped
	if w := e.do(req("POST", "/x", "k", "original")); w.Code != http.StatusCreated || w.Body.String() != "original" ||
		w.Header().Get(DefaultReplayedHeader) != "true" || e.calls.Load() != 1 || e.st.completes.Load() != 3 {
		t.Fatalf("retry: %d %q, %d executions, %d Complete calls; want the original replayed after 3", w.Code, w.Body, e.calls.Load(), e.st.completes.Load())
	}
}

// Background completion retries end when the lease is lost (a renewal finds it
// taken over): the renewals stop, nothing more is tried, and it is logged.
func TestCompleteRetriesEndWhenLeaseLost(t *testing.T) {
	logs := &logRecorder{}
	e := newEnv(t, echoHandler, WithLogger(slog.New(logs)))
	e.st.completeErr = errors.New("store down (injected)")
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	if ev := e.lastEvent(); ev.Decision != Executed || ev.Err == nil || !ev.CompletionPending {
		t.Fatalf("event %+v; want the completion pending", ev)
	}
	e.waitArmed(2)
	e.st.renewErr.Store(fmt.Errorf("taken over (injected): %w", store.ErrLeaseLost))
	for {
		if n, _ := e.clk.armed(); n == 0 {
			break
		}
		e.clk.fire() // renewals now fail with ErrLeaseLost
		runtime.Gosched()
	}
	for !logs.has("lease lost before completion") {
		runtime.Gosched() // the background completion logs its end
	}
	calls := e.st.completes.Load()
	if e.clk.fire() != 0 || e.st.completes.Load() != calls {
		t.Fatalf("completion still retried after the lease was lost")
	}
}

// A completion that keeps failing while the renewals pass is retried in the
// background for one lease, not forever: it ends with the store error logged,
// and the key stays claimed (409) until its lease runs out.
func TestCompleteRetriesLastOneLease(t *testing.T) {
	logs := &logRecorder{}
	e := newEnv(t, echoHandler, WithLogger(slog.New(logs)))
	e.st.completeErr = errors.New("store refuses this completion (injected)")
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	for e.st.completes.Load() < 10 || !logs.has("stays claimed") {
		if n, _ := e.clk.armed(); n == 2 { // the renewal and a back-off
			e.clk.fire() // renewals pass, back-offs end
		}
		runtime.Gosched()
	}
	// Back-offs of 20ms doubling to a third of the 10s lease: 9 fit in it.
	if n, r := logs.count(slog.LevelError); n != 1 || attr(r, "retries") != "9" || e.st.completes.Load() != 10 || e.st.renews.Load() == 0 {
		t.Fatalf("%d error lines (last %q retries=%s), %d Complete, %d Renew calls; want the store error after 9 retries, renewals passing",
			n, r.Message, attr(r, "retries"), e.st.completes.Load(), e.st.renews.Load())
	}
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusConflict || e.calls.Load() != 1 {
		t.Fatalf("duplicate: %d after %d executions; want 409, 1", w.Code, e.calls.Load())
	}
}

// Lease renewal: scheduled at a third of the lease, repeated, stopped on return.
func TestLeaseRenewal(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.Write([]byte("late"))
	}, WithLease(9*time.Second))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(req("POST", "/x", "k", "b")) }()
	<-entered
	// Dated from when the claim was sent: a little less than a third of the lease
	// is left once the handler runs.
	if n, d := e.clk.armed(); n != 1 || d > 3*time.Second || d < 2900*time.Millisecond {
		t.Fatalf("armed %d timers of %v, want 1 of 3s less the claim's time", n, d)
	}
	for i := range 3 {
		e.now.Add(3 * time.Second)
		if e.clk.fire() != 1 {
			t.Fatal("renewal not re-armed")
		}
		if got := e.st.renews.Load(); got != int32(i+1) {
			t.Fatalf("renews %d", got)
		}
	}
	// 9s have passed: without renewal the lease would have expired.
	checkProblem(t, e.do(req("POST", "/x", "k", "b")), http.StatusConflict, CodeInFlight)
	close(release)
	if w := <-done; w.Body.String() != "late" {
		t.Fatal(w.Body)
	}
	if n, _ := e.clk.armed(); n != 0 {
		t.Fatal("renewal still armed after the handler returned")
	}
	if e.clk.fire() != 0 || e.st.renews.Load() != 3 {
		t.Fatal("renewed after return")
	}
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "late" {
		t.Fatal("not stored")
	}
}

func TestRenewalStopsOnLeaseLost(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	handlerCtx := make(chan context.Context, 1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := KeyFromContext(r.Context()); ok && e_first(r) {
			handlerCtx <- r.Context()
			entered <- struct{}{}
			<-release
		}
	})
	go e.do(req("POST", "/x", "k", "first"))
	<-entered
	// Another process takes the key over after the lease expires.
	e.now.Add(claim.DefaultLease + time.Second)
	fp, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/x", Body: []byte("first")}, fingerprint.Options{})
	res, err := e.mem.Claim(context.Background(), store.ClaimRequest{ID: store.ID{Scope: "anonymous", Key: "k"},
		Fingerprint: fp, Lease: claim.DefaultLease, Retention: claim.DefaultRetention})
	if err != nil || !res.Takeover {
		t.Fatalf("takeover %+v %v", res, err)
	}
	e.clk.fire()
	if n, _ := e.clk.armed(); n != 0 {
		t.Fatal("renewal continues after ErrLeaseLost")
	}
	// The handler's context is cancelled: another request runs the key now.
	if err := context.Cause(<-handlerCtx); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("handler's context cause %v, want store.ErrLeaseLost", err)
	}
	close(release)
}

func e_first(r *http.Request) bool {
	b, _ := io.ReadAll(r.Body)
	return string(b) == "first"
}

// The capture keeps Flusher and ResponseController features for the live response.
func TestFlushAndResponseController(t *testing.T) {
	flushed := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			t.Error("not a Flusher")
		}
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		w.Write([]byte("part1;"))
		if err := rc.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		<-flushed
		w.Write([]byte("part2"))
	})
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	post := func() (*http.Response, error) {
		r, _ := http.NewRequest("POST", srv.URL+"/f", strings.NewReader("b"))
		r.Header.Set("Idempotency-Key", "k")
		return srv.Client().Do(r)
	}
	resp, err := post()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "part1;" {
		t.Fatalf("flushed part: %q %v", buf, err) // arrives before the handler returns
	}
	close(flushed)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "part2" {
		t.Fatalf("rest %q", rest)
	}
	resp, err = post()
	if err != nil {
		t.Fatal(err)
	}
	all, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(all) != "part1;part2" || resp.Header.Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("replay %q %v", all, resp.Header)
	}
}

func TestHijackReleases(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"))
		conn.Close()
	})
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	for i := range 2 {
		r, _ := http.NewRequest("POST", srv.URL+"/h", strings.NewReader("b"))
		r.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// The client has the hijacked answer before the middleware releases.
		e.waitEvents(i + 1)
	}
	if e.calls.Load() != 2 || e.lastEvent().Decision != Released {
		t.Fatalf("calls %d, event %+v", e.calls.Load(), e.lastEvent())
	}
}

// A handler whose hijack fails (the writer cannot hijack, as on HTTP/2) and that
// answers normally instead has that answer stored and replayed: a failed hijack
// releases nothing.
func TestFailedHijackStores(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Hijack on a recorder: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("answered"))
	})
	e.do(req("POST", "/h", "k", "b"))
	w := e.do(req("POST", "/h", "k", "b"))
	if w.Code != http.StatusCreated || w.Body.String() != "answered" || w.Header().Get(DefaultReplayedHeader) != "true" ||
		e.calls.Load() != 1 || e.st.releases.Load() != 0 {
		t.Fatalf("retry: %d %q after %d calls, %d releases; want the replay, 1 call, no release",
			w.Code, w.Body, e.calls.Load(), e.st.releases.Load())
	}
}

// lockedBuffer is a bytes.Buffer safe for a server's error log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A handler that sets a status the claim is released for (held back) and then
// hijacks answers on the connection itself: the held status is never written to
// the hijacked connection (net/http would log the misuse), the claim is released.
func TestHijackAfterHeldStatus(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("held"))
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"))
		conn.Close()
	})
	var errLog lockedBuffer
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.ErrorLog = log.New(&errLog, "", 0)
	srv.Start()
	defer srv.Close()
	r, _ := http.NewRequest("POST", srv.URL+"/h", strings.NewReader("b"))
	r.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e.waitEvents(1)
	if resp.StatusCode != 200 || string(b) != "hi" || e.lastEvent().Decision != Released || e.st.releases.Load() != 1 {
		t.Fatalf("%d %q, event %+v, %d releases; want the hijacked answer, released once", resp.StatusCode, b, e.lastEvent(), e.st.releases.Load())
	}
	if l := errLog.String(); l != "" {
		t.Fatalf("server error log: %q", l)
	}
}

func TestScopes(t *testing.T) {
	e := newEnv(t, echoHandler)
	e.do(req("POST", "/x", "k", "b", "X-Client-ID", "alice"))
	w := e.do(req("POST", "/x", "k", "other body", "X-Client-ID", "bob"))
	if w.Code != http.StatusCreated || w.Body.String() != "other body" || e.calls.Load() != 2 {
		t.Fatalf("scopes not isolated: %d %q", w.Code, w.Body)
	}
	// No header: the fallback scope.
	e.do(req("POST", "/x", "k", "c"))
	if id := e.lastEvent().ID; id.Scope != "anonymous" {
		t.Fatalf("scope %q", id.Scope)
	}
	if s := GlobalScope(req("POST", "/", "", "", "X-Client-ID", "a")); s != "" {
		t.Fatalf("GlobalScope = %q", s)
	}
	// A client that sends the fallback's value does not join the keyless clients:
	// the keyless request's key runs again for it, and its own scope is one no
	// header can name.
	w = e.do(req("POST", "/x", "k", "d", "X-Client-ID", "anonymous"))
	if w.Code != http.StatusCreated || w.Body.String() != "d" || w.Header().Get(DefaultReplayedHeader) != "" {
		t.Fatalf("X-Client-ID: anonymous shared the keyless scope: %d %q", w.Code, w.Body)
	}
	if id := e.lastEvent().ID; id.Scope == "anonymous" || id.Scope == "" {
		t.Fatalf("X-Client-ID: anonymous got scope %q", id.Scope)
	}
}

// One scope limit for every store, answered by the middleware with a message
// that names the scope, not the key.
func TestScopeOverTheLimit(t *testing.T) {
	e := newEnv(t, echoHandler)
	for _, n := range []int{store.MaxScopeLen + 1, 3000} {
		w := e.do(req("POST", "/x", "k", "b", "X-Client-ID", strings.Repeat("c", n)))
		p := checkProblem(t, w, http.StatusBadRequest, CodeScopeInvalid)
		if !strings.Contains(p.Detail, "scope") || !strings.Contains(p.Detail, "1024 bytes") || strings.Contains(p.Detail, "key") && !strings.Contains(p.Detail, "keys belong") {
			t.Errorf("detail %q does not name the scope and its limit", p.Detail)
		}
	}
	if e.calls.Load() != 0 || e.lastEvent().Decision != KeyInvalid {
		t.Fatalf("calls %d, event %+v", e.calls.Load(), e.lastEvent())
	}
	if w := e.do(req("POST", "/x", "k", "b", "X-Client-ID", strings.Repeat("c", store.MaxScopeLen))); w.Code != http.StatusCreated {
		t.Fatalf("scope at the limit: %d %s", w.Code, w.Body)
	}
}

func TestObserverOncePerRequest(t *testing.T) {
	e := newEnv(t, echoHandler)
	reqs := []*http.Request{
		req("GET", "/x", "", ""), req("POST", "/x", "", ""), req("POST", "/x", "k", "a"),
		req("POST", "/x", "k", "a"), req("POST", "/x", "k", "b"),
	}
	want := []Decision{PassThrough, KeyMissing, Executed, Replayed, Mismatch}
	for i, r := range reqs {
		e.do(r)
		if e.eventCount() != i+1 || e.lastEvent().Decision != want[i] {
			t.Fatalf("request %d: %d events, last %v want %v", i, e.eventCount(), e.lastEvent().Decision, want[i])
		}
	}
	if e.lastEvent().StoreLatency <= 0 {
		t.Fatal("store latency not measured")
	}
	if Replayed.String() != "replayed" || Decision(0).String() != "unknown" {
		t.Fatal("decision names")
	}
}

// The conformance fixture's concurrent storm: many identical requests at once run
// the handler once; every other answer is a replay or a 409.
func TestConcurrentDuplicates(t *testing.T) {
	e := newEnv(t, echoHandler)
	var wg sync.WaitGroup
	codes := make(chan int, 64)
	for range 64 {
		wg.Go(func() {
			w := e.do(req("POST", "/x", "storm", "b"))
			if w.Code == http.StatusCreated && w.Body.String() != "b" {
				t.Error("wrong body")
			}
			codes <- w.Code
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusCreated && c != http.StatusConflict {
			t.Fatalf("status %d", c)
		}
	}
	if e.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", e.calls.Load())
	}
}

// The router's own answers (no application route matched) do not consume the
// key; a handler's own 404 does, as the release rule says.
func TestUnroutedReleases(t *testing.T) {
	newMux := func() *http.ServeMux {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /echo", echoHandler)
		mux.HandleFunc("POST /items/{id}", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no such item", http.StatusNotFound) // the application's answer
		})
		mux.HandleFunc("POST /dir/", echoHandler)
		mux.HandleFunc("POST /dir/moved", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/dir/new", http.StatusTemporaryRedirect) // the application's answer
		})
		return mux
	}
	// A router that is not a ServeMux marks its own answers with Unrouted.
	custom := func() http.Handler {
		notFound := Unrouted(http.NotFoundHandler())
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/echo":
				echoHandler(w, r)
			case "/items/1":
				http.Error(w, "no such item", http.StatusNotFound)
			default:
				notFound.ServeHTTP(w, r)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		handler http.Handler
		opts    []Option
		first   *http.Request
		status  int
		release bool
	}{
		{"mux 405", newMux(), nil, req("PATCH", "/echo", "k", "x"), http.StatusMethodNotAllowed, true},
		{"mux 404", newMux(), nil, req("POST", "/ech", "k", "x"), http.StatusNotFound, true},
		// The mux's redirect to the canonical path: the client that follows it
		// sends the same key to another route (a 422 if the redirect were stored).
		{"mux redirect to the subtree", newMux(), nil, req("POST", "/dir", "k", "x"), http.StatusMultipleChoices /* any 3xx */, true},
		{"mux redirect to the cleaned path", newMux(), nil, req("POST", "/dir//a?q=1", "k", "x"), http.StatusMultipleChoices, true},
		{"mux: handler's own redirect elsewhere", newMux(), nil, req("POST", "/dir/moved", "k", "x"), http.StatusMultipleChoices, false},
		{"mux: handler's own 404", newMux(), nil, req("POST", "/items/1", "k", "x"), http.StatusNotFound, false},
		{"mux 405, release off", newMux(), []Option{WithRelease(ReleaseRule{StoreUnrouted: true})}, req("PATCH", "/echo", "k", "x"), http.StatusMethodNotAllowed, false},
		{"custom router, Unrouted 404", custom(), nil, req("POST", "/ech", "k", "x"), http.StatusNotFound, true},
		{"custom router, handler's own 404", custom(), nil, req("POST", "/items/1", "k", "x"), http.StatusNotFound, false},
		{"plain handler's 404 (no ServeMux)", http.NotFoundHandler(), nil, req("POST", "/echo", "k", "x"), http.StatusNotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvHandler(t, tc.handler, tc.opts...)
			if w := e.do(tc.first); w.Code != tc.status && !(tc.status == http.StatusMultipleChoices && w.Code/100 == 3) {
				t.Fatalf("first request: %d, want %d", w.Code, tc.status)
			}
			if got := e.lastEvent().Decision == Released; got != tc.release {
				t.Fatalf("released = %v, want %v (event %+v)", got, tc.release, e.lastEvent())
			}
			// The same key on the same request again: runs again if released,
			// replayed otherwise.
			w := e.do(req(tc.first.Method, tc.first.URL.String(), "k", "x"))
			if replayed := w.Header().Get(DefaultReplayedHeader) == "true"; replayed == tc.release {
				t.Fatalf("retry: replayed = %v with release %v", replayed, tc.release)
			}
			if !tc.release {
				return
			}
			// The corrected request with the same key runs.
			if w := e.do(req("POST", "/echo", "k", "x")); w.Code != http.StatusCreated || w.Body.String() != "x" {
				t.Fatalf("corrected request: %d %q, want 201", w.Code, w.Body)
			}
		})
	}
}

// Behind an outer ServeMux the inner one still decides: the outer match's
// Pattern is not taken for an inner route.
func TestUnroutedNestedMux(t *testing.T) {
	inner := http.NewServeMux()
	inner.HandleFunc("POST /api/echo", echoHandler)
	m, err := New(memory.New(), GlobalScope, WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	outer := http.NewServeMux()
	outer.Handle("/api/", m.Handler(inner))
	for i, want := range []int{http.StatusMethodNotAllowed, http.StatusCreated, http.StatusCreated} {
		r := req("POST", "/api/echo", "k", "x")
		if i == 0 {
			r.Method = "PATCH"
		}
		w := httptest.NewRecorder()
		outer.ServeHTTP(w, r)
		if w.Code != want || i == 2 && w.Header().Get(DefaultReplayedHeader) != "true" {
			t.Fatalf("request %d: %d %v, want %d", i, w.Code, w.Header(), want)
		}
	}
}

// TestReplayDoesNotAliasRecord: an outer middleware that edits a replayed header
// value in place (or appends to it) leaves the stored record, and so every later
// replay, as it was: store/memory returns the same record to every claim.
func TestReplayDoesNotAliasRecord(t *testing.T) {
	m, err := New(memory.New(), GlobalScope, WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-A"] = []string{"a1", "a2"}
		w.Header().Set("X-B", "b")
		w.WriteHeader(201)
	}))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r)
		if a := w.Header()["X-A"]; len(a) > 0 {
			a[0] = "edited"
			w.Header()["X-A"] = append(a[:1], "appended")
		}
	})
	for i := range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/x", "k", "body"))
		if i == 0 {
			continue
		}
		if got := w.Result().Header; got.Get(DefaultReplayedHeader) != "true" ||
			!slices.Equal(got["X-A"], []string{"a1", "a2"}) || got.Get("X-B") != "b" {
			t.Fatalf("replay %d sent X-A %q X-B %q (replayed %q), want the stored a1, a2 and b", i, got["X-A"], got.Get("X-B"), got.Get(DefaultReplayedHeader))
		}
	}
}
