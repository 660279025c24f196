package client

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/policy"
)

// zeros is a body of n bytes without GetBody (http.NewRequest knows no such
// reader), produced on demand.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// countingServer answers each attempt with the next status and records the
// size of each body it read.
type countingServer struct {
	statuses []int
	sizes    []int64
}

func (s *countingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	s.sizes = append(s.sizes, n)
	w.WriteHeader(s.statuses[min(len(s.sizes), len(s.statuses))-1])
}

// TestBodyWithoutGetBodyIsBounded: a body without GetBody is kept for the
// retries only up to the limit (default DefaultMaxBufferedBody). Up to it,
// every attempt sends the whole body; above it, the request is sent once,
// streamed whole, not retried, and a transport error says why. Sending 64 MiB
// allocates far less than 64 MiB.
func TestBodyWithoutGetBodyIsBounded(t *testing.T) {
	const limit = 1 << 10
	for _, tc := range []struct {
		size     int64
		attempts int
	}{{0, 2}, {1, 2}, {limit, 2}, {limit + 1, 1}, {10 * limit, 1}} {
		t.Run(strconv.FormatInt(tc.size, 10), func(t *testing.T) {
			s := &countingServer{statuses: []int{503, 201}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			tr, _ := newTransport(t, WithMaxBufferedBody(limit))
			resp, err := post(t, tr, srv.URL, io.MultiReader(&zeros{tc.size}), "")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(s.sizes) != tc.attempts {
				t.Fatalf("%d attempts, want %d", len(s.sizes), tc.attempts)
			}
			for i, n := range s.sizes {
				if n != tc.size {
					t.Errorf("attempt %d sent %d bytes, want %d", i+1, n, tc.size)
				}
			}
		})
	}
	t.Run("lost answer over the limit is not retried, and says so", func(t *testing.T) {
		s := &script{statuses: []int{201}, hijack: 1}
		srv := httptest.NewServer(s)
		defer srv.Close()
		tr, _ := newTransport(t, WithMaxBufferedBody(limit))
		_, err := post(t, tr, srv.URL, io.MultiReader(&zeros{limit + 1}), "")
		if err == nil || s.attempts() != 1 || !errors.Is(err, ErrBodyNotRetried) ||
			!strings.Contains(err.Error(), strconv.Itoa(limit)) {
			t.Fatalf("err %v after %d attempts; want one attempt and ErrBodyNotRetried naming the limit", err, s.attempts())
		}
	})
	t.Run("64 MiB with the default limit", func(t *testing.T) {
		s := &countingServer{statuses: []int{201}}
		srv := httptest.NewServer(s)
		defer srv.Close()
		tr, _ := newTransport(t)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp, err := post(t, tr, srv.URL, io.MultiReader(&zeros{64 << 20}), "")
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("64 MiB sent, %.1f MiB allocated", float64(got)/(1<<20))
		if got > 32<<20 || s.sizes[0] != 64<<20 {
			t.Fatalf("sent %d bytes, allocating %d MiB: want all 64 MiB sent and under 32 MiB allocated", s.sizes[0], got>>20)
		}
	})
}

// TestKeyUnderNonCanonicalName: a key the caller put in the header map under
// any spelling of the key header's name (req.Header["idempotency-key"], set
// directly) is the request's key: every attempt carries it alone, none a
// minted one.
func TestKeyUnderNonCanonicalName(t *testing.T) {
	for _, tc := range []struct{ header, mapKey string }{
		{"", "idempotency-key"},
		{"", "IDEMPOTENCY-KEY"},
		{"", "idempotency-Key"},
		{"X-Idem-Key", "x-idem-key"},
	} {
		t.Run(tc.mapKey, func(t *testing.T) {
			var keys []string
			attempt := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				name := tc.header
				if name == "" {
					name = policy.DefaultKeyHeader
				}
				keys = append(keys, strings.Join(r.Header.Values(name), "|"))
				if attempt++; attempt == 1 {
					w.WriteHeader(503)
				}
			}))
			defer srv.Close()
			var opts []Option
			if tc.header != "" {
				opts = append(opts, WithKeyHeader(tc.header))
			}
			tr, _ := newTransport(t, opts...)
			req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
			req.Header[tc.mapKey] = []string{`"k1"`}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(keys) != 2 || keys[0] != `"k1"` || keys[1] != `"k1"` {
				t.Fatalf("attempts carried keys %q, want the caller's \"k1\" alone on both", keys)
			}
			if len(req.Header) != 1 || req.Header[tc.mapKey][0] != `"k1"` {
				t.Fatalf("the caller's header changed: %v", req.Header)
			}
		})
	}
}
