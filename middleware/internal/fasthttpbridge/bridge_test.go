package fasthttpbridge

import (
	"bufio"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// TestRequest checks the net/http view field by field: every header line a
// value (a repeated line stays two values, in order), names canonical, Host
// and Transfer-Encoding in their fields, the body readable, no string
// aliasing fasthttp's buffers (they change after the request).
func TestRequest(t *testing.T) {
	fc := newCtx(t)
	fc.Request.Header.Add("X-Twice", "a")
	fc.Request.Header.Add("X-Twice", "b")
	fc.Request.Header.DisableNormalizing()
	fc.Request.Header.Add("x-lower", "c")
	r, err := Request(context.WithValue(context.Background(), t, 1), fc)
	if err != nil {
		t.Fatal(err)
	}
	want := http.Header{
		"User-Agent": {"Go-http-client/1.1"}, "Content-Length": {"16"}, "Content-Type": {"application/json"},
		"Idempotency-Key": {"0a1b2c3d-0001-4000-8000-000000000001"}, "X-Client-Id": {"tenant-1"},
		"Accept-Encoding": {"gzip"}, "X-Twice": {"a", "b"}, "X-Lower": {"c"},
	}
	if !reflect.DeepEqual(r.Header, want) {
		t.Errorf("header %v, want %v", r.Header, want)
	}
	if r.Method != "POST" || r.RequestURI != "/api/transfers" || r.URL.Path != "/api/transfers" ||
		r.Host != "127.0.0.1:8080" || r.RemoteAddr != "127.0.0.1:40000" || r.ContentLength != 16 || r.Context().Value(t) != 1 {
		t.Errorf("request %+v", r)
	}
	// Appending to one value must not overwrite the next header's.
	r.Header["Content-Type"] = append(r.Header["Content-Type"], "x")
	if r.Header.Get("Idempotency-Key") != want.Get("Idempotency-Key") || r.Header.Get("X-Client-Id") != "tenant-1" {
		t.Errorf("an append changed another header: %v", r.Header)
	}
	key := r.Header.Get("Idempotency-Key")
	fc.Request.Reset() // fasthttp reuses its buffers
	fc.Request.Header.Set("Idempotency-Key", strings.Repeat("z", len(key)))
	if r.Header.Get("Idempotency-Key") != key || r.Method != "POST" {
		t.Errorf("the request aliases fasthttp's buffers: %v", r.Header)
	}
	if b, err := io.ReadAll(r.Body); err != nil || string(b) != `{"amount":12345}` || r.Body.Close() != nil {
		t.Errorf("body %q, %v", b, err)
	}
}

func TestRequestTransferEncodingAndBadURI(t *testing.T) {
	fc := newCtx(t)
	fc.Request.Header.Set("Transfer-Encoding", "chunked")
	r, err := Request(context.Background(), fc)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Header["Transfer-Encoding"]; ok || len(r.TransferEncoding) > 1 {
		t.Errorf("Transfer-Encoding %v in the header, %v in the field", r.Header["Transfer-Encoding"], r.TransferEncoding)
	}
	fc.Request.SetRequestURI("%zz")
	if _, err := Request(context.Background(), fc); err == nil {
		t.Error("an invalid request URI parsed")
	}
}

// TestWriter: the core's lines reach the response once each; an outer line
// the core sets again is replaced, not doubled; one it leaves stays. A writer
// given back (Release) starts the next response afresh, and the values a
// stored response kept of the last one do not change.
func TestWriter(t *testing.T) {
	var kept [][]string
	for i, outer := range []bool{false, true, false, true, false} {
		fc := newCtx(t)
		if outer {
			fc.Response.Header.Set("X-Request-Id", "outer")
			fc.Response.Header.Set("X-Kept", "k")
		}
		w := NewWriter(&fc.Response)
		if want := map[bool]int{false: 0, true: 2}[outer]; len(w.Header()) != want {
			t.Fatalf("response %d: the writer starts with %v, want %d outer lines", i, w.Header(), want)
		}
		w.Header()["X-Request-Id"] = []string{"core"}
		w.Header()["Vary"] = []string{"a", strconv.Itoa(i)}
		kept = append(kept, w.Header()["Vary"])
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("ok"))
		var got []string
		fc.Response.Header.VisitAll(func(k, v []byte) {
			if string(k) != "Content-Type" && string(k) != "Content-Length" {
				got = append(got, string(k)+": "+string(v))
			}
		})
		want := []string{"X-Request-Id: core", "Vary: a", "Vary: " + strconv.Itoa(i)}
		if outer {
			want = append(want, "X-Kept: k")
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) || fc.Response.StatusCode() != 201 || string(fc.Response.Body()) != "ok" {
			t.Errorf("response %d, outer lines %v: %d %q %q, want %q", i, outer, fc.Response.StatusCode(), fc.Response.Body(), got, want)
		}
		Release(w)
	}
	for i, v := range kept {
		if !slices.Equal(v, []string{"a", strconv.Itoa(i)}) {
			t.Errorf("response %d's stored values became %q", i, v)
		}
	}
}

// appendRemoteAddr appends net.TCPAddr.String for every kind of address: IPv4 in both
// forms, IPv6 with and without a zone, IPv4-mapped IPv6, nil and bad IPs.
func TestRemoteAddrIsTCPAddrString(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		var ip net.IP
		switch i % 6 {
		case 0:
			ip = net.IPv4(byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())) // 16-byte form
		case 1:
			ip = net.IPv4(byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())).To4()
		case 2, 3:
			ip = make(net.IP, 16)
			for j := range ip {
				if rng.IntN(3) > 0 { // runs of zeros exercise the :: forms
					ip[j] = byte(rng.Uint32())
				}
			}
		case 4:
			ip = nil
		case 5:
			ip = make(net.IP, rng.IntN(20)) // bad lengths
		}
		a := &net.TCPAddr{IP: ip, Port: rng.IntN(70000) - 1000}
		if rng.IntN(4) == 0 {
			a.Zone = "eth0"
		}
		if got, want := string(appendRemoteAddr([]byte("x"), a)[1:]), a.String(); got != want {
			t.Fatalf("appendRemoteAddr(%#v) = %q, want %q", a, got, want)
		}
	}
	if got := string(appendRemoteAddr(nil, &net.UnixAddr{Name: "/tmp/s", Net: "unix"})); got != "/tmp/s" {
		t.Fatalf("unix address: %q", got)
	}
}

// TestPlainURIIsParseRequestURI: for every generated request URI the fast
// path takes, the URL is the one url.ParseRequestURI returns; URIs of every
// other kind are left to it. The alphabet mixes the plain characters with
// those that need escaping, unescaping or another parse ("%", "?", "#", "//",
// spaces, controls, non-ASCII).
func TestPlainURIIsParseRequestURI(t *testing.T) {
	const alphabet = "aZ09-._~/////????%%#+&=:@!$'()*,;[] \x00\x7f\xc3\xa9"
	rng := rand.New(rand.NewPCG(3, 4))
	taken := 0
	fixed := []string{"/", "/api/transfers", "/p?", "/p?a=1&b=2", "//x", "/p??", "/p?a?b", "/a%2Fb", "*", "", "/p#f"}
	for i := range 200000 {
		var uri string
		if i < len(fixed) {
			uri = fixed[i]
		} else {
			b := []byte{'/'}
			if rng.IntN(20) == 0 {
				b = b[:0]
			}
			for range rng.IntN(12) {
				b = append(b, alphabet[rng.IntN(len(alphabet))])
			}
			uri = string(b)
		}
		var got url.URL
		if !parsePlainURI(&got, uri) {
			continue
		}
		taken++
		want, err := url.ParseRequestURI(uri)
		if err != nil || !reflect.DeepEqual(&got, want) {
			t.Fatalf("%q: fast path %#v, url.ParseRequestURI %#v, %v", uri, got, want, err)
		}
	}
	if taken < 10000 {
		t.Errorf("the fast path took %d URIs of 200000; the test exercises too few", taken)
	}
}
