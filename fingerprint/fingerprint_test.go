package fingerprint

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/idemkey/idemkey/store"
)

func sum(t *testing.T, r Request, o Options) store.Fingerprint {
	t.Helper()
	fp, err := Sum(r, o)
	if err != nil {
		t.Fatalf("Sum(%+v): %v", r, err)
	}
	return fp
}

func TestSumRules(t *testing.T) {
	base := Request{Method: "POST", Route: "/pay", RawQuery: "a=1&b=2", Body: []byte(`{"x":1}`)}
	with := func(f func(*Request)) Request { r := base; f(&r); return r }
	tests := []struct {
		name  string
		a, b  Request
		opts  Options
		equal bool
	}{
		{"identical", base, base, Options{}, true},
		{"method differs", base, with(func(r *Request) { r.Method = "PATCH" }), Options{}, false},
		{"method case matters", base, with(func(r *Request) { r.Method = "post" }), Options{}, false},
		{"route differs", base, with(func(r *Request) { r.Route = "/pay2" }), Options{}, false},
		{"body differs", base, with(func(r *Request) { r.Body = []byte(`{"x":2}`) }), Options{}, false},
		{"query sorted by key", base, with(func(r *Request) { r.RawQuery = "b=2&a=1" }), Options{}, true},
		{"repeated params keep order", with(func(r *Request) { r.RawQuery = "a=1&a=2" }), with(func(r *Request) { r.RawQuery = "a=2&a=1" }), Options{}, false},
		{"repeated params interleaved", with(func(r *Request) { r.RawQuery = "a=1&b=x&a=2" }), with(func(r *Request) { r.RawQuery = "b=x&a=1&a=2" }), Options{}, true},
		{"query percent-decoded", with(func(r *Request) { r.RawQuery = "a=%41" }), with(func(r *Request) { r.RawQuery = "a=A" }), Options{}, true},
		{"plus is space", with(func(r *Request) { r.RawQuery = "a=x+y" }), with(func(r *Request) { r.RawQuery = "a=x%20y" }), Options{}, true},
		{"empty pairs dropped", with(func(r *Request) { r.RawQuery = "&a=1&&b=2&" }), base, Options{}, true},
		{"a equals a=", with(func(r *Request) { r.RawQuery = "a" }), with(func(r *Request) { r.RawQuery = "a=" }), Options{}, true},
		{"query value differs", base, with(func(r *Request) { r.RawQuery = "a=1&b=3" }), Options{}, false},
		{"no field shifting: route/query", with(func(r *Request) { r.Route = "/p"; r.RawQuery = "" }), with(func(r *Request) { r.Route = ""; r.RawQuery = "/p" }), Options{}, false},
		{"no field shifting: key/value", with(func(r *Request) { r.RawQuery = "ab=c" }), with(func(r *Request) { r.RawQuery = "a=bc" }), Options{}, false},
		{"raw body: whitespace matters", base, with(func(r *Request) { r.Body = []byte(`{ "x": 1 }`) }), Options{}, false},
		{"json: whitespace ignored", base, with(func(r *Request) { r.Body = []byte(" {\n\"x\" : 1 }\t") }), Options{CanonicalJSON: true}, true},
		{"json: keys sorted", with(func(r *Request) { r.Body = []byte(`{"a":1,"b":2}`) }), with(func(r *Request) { r.Body = []byte(`{"b":2,"a":1}`) }), Options{CanonicalJSON: true}, true},
		{"json: arrays not reordered", with(func(r *Request) { r.Body = []byte(`[1,2]`) }), with(func(r *Request) { r.Body = []byte(`[2,1]`) }), Options{CanonicalJSON: true}, false},
		{"json: numbers as sent", with(func(r *Request) { r.Body = []byte(`{"n":1.0}`) }), with(func(r *Request) { r.Body = []byte(`{"n":1}`) }), Options{CanonicalJSON: true}, false},
		{"json: strings as sent", with(func(r *Request) { r.Body = []byte(`"\u0041"`) }), with(func(r *Request) { r.Body = []byte(`"A"`) }), Options{CanonicalJSON: true}, false},
		{"json vs raw never collide", base, base, Options{CanonicalJSON: true}, false},
		// A malformed escape is kept as sent and never equals a decoded '%'.
		{"malformed escape vs its escaped twin", with(func(r *Request) { r.RawQuery = "ms=%zz&ms=50" }), with(func(r *Request) { r.RawQuery = "ms=%25zz&ms=50" }), Options{}, false},
		{"malformed key vs its escaped twin", with(func(r *Request) { r.RawQuery = "%zz=1" }), with(func(r *Request) { r.RawQuery = "%25zz=1" }), Options{}, false},
		{"truncated escape vs its escaped twin", with(func(r *Request) { r.RawQuery = "a=%4" }), with(func(r *Request) { r.RawQuery = "a=%254" }), Options{}, false},
		{"malformed component not decoded", with(func(r *Request) { r.RawQuery = "a=%zz%41" }), with(func(r *Request) { r.RawQuery = "a=%zzA" }), Options{}, false},
		{"malformed escape as sent is stable", with(func(r *Request) { r.RawQuery = "b=%zz&a=1" }), with(func(r *Request) { r.RawQuery = "a=1&b=%zz" }), Options{}, true},
		{"content encoding counts", base, with(func(r *Request) { r.ContentEncoding = "gzip" }), Options{}, false},
		{"content encoding case and spaces", with(func(r *Request) { r.ContentEncoding = "gzip, br" }), with(func(r *Request) { r.ContentEncoding = "GZIP,br" }), Options{}, true},
		{"content encodings differ", with(func(r *Request) { r.ContentEncoding = "gzip" }), with(func(r *Request) { r.ContentEncoding = "br" }), Options{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fa := sum(t, tt.a, tt.opts)
			ob := tt.opts
			if tt.name == "json vs raw never collide" {
				ob = Options{}
			}
			fb := sum(t, tt.b, ob)
			if (fa == fb) != tt.equal {
				t.Fatalf("equal = %v, want %v", fa == fb, tt.equal)
			}
		})
	}
}

func TestSumIsSHA256Sized(t *testing.T) {
	fp := sum(t, Request{Method: "POST"}, Options{})
	if len(fp.String()) != 64 || fp == (store.Fingerprint{}) {
		t.Fatalf("fingerprint %s", fp)
	}
}

func TestCanonicalQuery(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"b=2&a=1", "a=1&b=2"},
		{"a=2&b=1&a=1", "a=2&a=1&b=1"},
		{"x=%zz&y=%4", "x=%zz&y=%4"},
		{"x=%25zz&y=%254", "x=%25zz&y=%254"},
		{"a=%zz%41&b=%41", "a=%zz%41&b=A"},
		{"k=a%26b", "k=a%26b"},
		{"flag", "flag="},
	}
	for _, tt := range tests {
		if got := string(AppendCanonicalQuery(nil, tt.in)); got != tt.want {
			t.Errorf("AppendCanonicalQuery(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{` { "z" : [ 3 , 1 , {"y":true,"x":null} ] , "a" : "s p" } `, `{"a":"s p","z":[3,1,{"x":null,"y":true}]}`},
		{`{"ab":1,"a":2,"a\u0000":3}`, `{"a":2,"a\u0000":3,"ab":1}`},
		{`-0.5e+10`, `-0.5e+10`},
		{`"é\n"`, `"é\n"`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`{"o":{}}`, `{"o":{}}`},
		{`1E400`, `1E400`},
	}
	for _, tt := range tests {
		got, err := AppendCanonicalJSON(nil, []byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("AppendCanonicalJSON(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestCanonicalJSONInvalid(t *testing.T) {
	for _, in := range []string{
		``, ` `, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `01`, `1.`, `1e`, `-`, `+1`,
		`tru`, `nul`, `"abc`, "\"a\x01\"", `"\x"`, `"\u12G4"`, `{"a":1} x`, `{} {}`, `{1:2}`,
		strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1),
	} {
		_, err := AppendCanonicalJSON(nil, []byte(in))
		var je *JSONError
		if !errors.Is(err, ErrInvalidJSON) || !errors.As(err, &je) {
			t.Errorf("AppendCanonicalJSON(%q) error = %v, want ErrInvalidJSON", in, err)
		}
		if _, err := Sum(Request{Method: "POST", Body: []byte(in)}, Options{CanonicalJSON: true}); len(in) > 0 && !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("Sum(%q) error = %v, want ErrInvalidJSON", in, err)
		}
	}
	// The deepest accepted nesting.
	deep := strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth)
	if _, err := AppendCanonicalJSON(nil, []byte(deep)); err != nil {
		t.Errorf("depth %d: %v", MaxJSONDepth, err)
	}
}

func TestCanonicalJSONEmptyBodyIsRaw(t *testing.T) {
	a := sum(t, Request{Method: "POST"}, Options{CanonicalJSON: true})
	b := sum(t, Request{Method: "POST"}, Options{})
	if a != b {
		t.Fatal("empty body hashed differently in JSON mode")
	}
}

func TestReadBody(t *testing.T) {
	tests := []struct {
		name    string
		body    io.Reader
		cl      int64
		limit   int64
		want    string
		tooBig  bool
		readErr bool
	}{
		{"nil", nil, 0, 10, "", false, false},
		{"no body", http.NoBody, 0, 10, "", false, false},
		{"exact limit", strings.NewReader("0123456789"), -1, 10, "0123456789", false, false},
		{"one over, unknown length", strings.NewReader("0123456789A"), -1, 10, "", true, false},
		{"declared over", strings.NewReader("x"), 11, 10, "", true, false},
		{"declared length", strings.NewReader("abc"), 3, 10, "abc", false, false},
		{"byte at a time", iotest.OneByteReader(strings.NewReader("slow body")), -1, 100, "slow body", false, false},
		{"no limit", strings.NewReader(strings.Repeat("z", 5000)), -1, -1, strings.Repeat("z", 5000), false, false},
		// A declared length is not allocated up front without a limit.
		{"no limit, huge declared length", strings.NewReader("abc"), 1 << 62, -1, "abc", false, false},
		{"read error", iotest.ErrReader(errors.New("boom")), -1, 10, "", false, true},
		{"outer MaxBytesReader", http.MaxBytesReader(nil, io.NopCloser(strings.NewReader("0123456789")), 4), -1, 100, "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadBody(tt.body, tt.cl, tt.limit, nil)
			switch {
			case tt.tooBig:
				var tl *TooLargeError
				if !errors.Is(err, ErrBodyTooLarge) || !errors.As(err, &tl) {
					t.Fatalf("err = %v, want TooLargeError", err)
				}
			case tt.readErr:
				if err == nil || errors.Is(err, ErrBodyTooLarge) {
					t.Fatalf("err = %v, want read error", err)
				}
			case err != nil || string(got) != tt.want:
				t.Fatalf("ReadBody = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestReadBodyReadsAtMostLimitPlusOne(t *testing.T) {
	r := strings.NewReader(strings.Repeat("x", 100))
	_, err := ReadBody(r, -1, 10, nil)
	if !errors.Is(err, ErrBodyTooLarge) {
		t.Fatal(err)
	}
	if r.Len() != 100-11 {
		t.Fatalf("read %d bytes, want 11", 100-r.Len())
	}
}

func TestReadBodyReusesBuffer(t *testing.T) {
	buf := make([]byte, 0, 64)
	got, err := ReadBody(strings.NewReader("hello"), 5, 100, buf)
	if err != nil || string(got) != "hello" || &got[:1][0] != &buf[:1][0] {
		t.Fatalf("did not read into the given buffer: %q %v", got, err)
	}
}

func TestFromRequestKeepsBody(t *testing.T) {
	r := httptest.NewRequest("POST", "/x?b=1&a=2", strings.NewReader(`{"k": 1}`))
	fp, err := FromRequest(r, "/x", Options{CanonicalJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != `{"k": 1}` {
		t.Fatalf("handler sees %q", got)
	}
	want := sum(t, Request{Method: "POST", Route: "/x", RawQuery: "a=2&b=1", Body: []byte(`{"k":1}`)}, Options{CanonicalJSON: true})
	if fp != want {
		t.Fatal("fingerprint differs from Sum")
	}
	if r.GetBody == nil {
		t.Fatal("GetBody not set")
	}
}

func TestFromRequestTooLargeRestoresBody(t *testing.T) {
	body := strings.Repeat("y", 50)
	r := httptest.NewRequest("POST", "/x", strings.NewReader(body))
	r.ContentLength = -1
	_, err := FromRequest(r, "/x", Options{MaxBody: 10})
	if !errors.Is(err, ErrBodyTooLarge) {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != body {
		t.Fatalf("body after 413 = %q", got)
	}
}

// FuzzSum: equal inputs give equal fingerprints; reordering distinct query keys
// does not change the fingerprint; Sum never panics.
func FuzzSum(f *testing.F) {
	f.Add("POST", "/pay", "a=1&b=2", []byte(`{"x":1}`), true)
	f.Add("PATCH", "/", "a=%zz&a=+", []byte("raw\x00bytes"), false)
	f.Add("POST", "/p", "", []byte(`[1,{"b":2,"a":[]}]`), true)
	f.Fuzz(func(t *testing.T, method, route, query string, body []byte, js bool) {
		o := Options{CanonicalJSON: js}
		a, errA := Sum(Request{Method: method, Route: route, RawQuery: query, Body: body}, o)
		b, errB := Sum(Request{Method: method, Route: route, RawQuery: query, Body: bytes.Clone(body)}, o)
		if (errA == nil) != (errB == nil) || a != b {
			t.Fatalf("not deterministic: %v %v", errA, errB)
		}
		if errA != nil && !errors.Is(errA, ErrInvalidJSON) && !errors.Is(errA, ErrDuplicateName) {
			t.Fatalf("unexpected error %v", errA)
		}
		if i := strings.IndexByte(query, '&'); i > 0 && !strings.Contains(query[i+1:], "&") {
			x, y := query[:i], query[i+1:]
			kx, _, _ := strings.Cut(x, "=")
			ky, _, _ := strings.Cut(y, "=")
			if kx != ky && !strings.ContainsAny(kx+ky, "%+") {
				c, _ := Sum(Request{Method: method, Route: route, RawQuery: y + "&" + x, Body: body}, o)
				if errA == nil && c != a {
					t.Fatalf("query order changed fingerprint: %q", query)
				}
			}
		}
	})
}

// oracleQuery is the query equivalence written independently of the package:
// each key and value decoded with net/url when it is well formed, tagged as sent
// otherwise; pairs stably sorted by key.
func oracleQuery(q string) string {
	type comp struct {
		raw bool
		s   string
	}
	c := func(s string) comp {
		if d, err := url.QueryUnescape(s); err == nil {
			return comp{false, d}
		}
		return comp{true, s}
	}
	var pairs [][2]comp
	for part := range strings.SplitSeq(q, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		pairs = append(pairs, [2]comp{c(k), c(v)})
	}
	slices.SortStableFunc(pairs, func(a, b [2]comp) int {
		if r := strings.Compare(a[0].s, b[0].s); r != 0 {
			return r
		}
		switch {
		case a[0].raw == b[0].raw:
			return 0
		case b[0].raw:
			return -1
		}
		return 1
	})
	return fmt.Sprintf("%#v", pairs)
}

// FuzzQueryInjective: two raw queries share a fingerprint (and a canonical
// form) exactly when they are equivalent: every key and value decodes to the
// same bytes or is the same malformed text as sent. Invalid percent-escapes
// never collapse into valid ones.
func FuzzQueryInjective(f *testing.F) {
	f.Add("ms=%zz&ms=50", "ms=%25zz&ms=50")
	f.Add("a=%4", "a=%254")
	f.Add("%zz=1", "%25zz=1")
	f.Add("a=%zz%41", "a=%zzA")
	f.Add("b=2&a=1", "a=1&b=2")
	f.Add("a=x+y", "a=x%20y")
	f.Add("a=1&a=2", "a=2&a=1")
	f.Fuzz(func(t *testing.T, qa, qb string) {
		fa := sum(t, Request{Method: "POST", Route: "/", RawQuery: qa}, Options{})
		fb := sum(t, Request{Method: "POST", Route: "/", RawQuery: qb}, Options{})
		equiv := oracleQuery(qa) == oracleQuery(qb)
		if (fa == fb) != equiv {
			t.Fatalf("Sum(%q) == Sum(%q) is %v, equivalent is %v", qa, qb, fa == fb, equiv)
		}
		ca, cb := string(AppendCanonicalQuery(nil, qa)), string(AppendCanonicalQuery(nil, qb))
		if (ca == cb) != equiv {
			t.Fatalf("canonical %q and %q: equal %v, equivalent %v", ca, cb, ca == cb, equiv)
		}
	})
}

func TestFromRequestContentEncoding(t *testing.T) {
	mk := func(ce ...string) store.Fingerprint {
		r := httptest.NewRequest("POST", "/x", strings.NewReader("body"))
		for _, v := range ce {
			r.Header.Add("Content-Encoding", v)
		}
		fp, err := FromRequest(r, "/x", Options{})
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	if mk() == mk("gzip") {
		t.Error("a gzip body shares the fingerprint of its plain twin")
	}
	if mk("gzip", "br") != mk("gzip, br") {
		t.Error("Content-Encoding in two lines differs from one line")
	}
	if mk() != sum(t, Request{Method: "POST", Route: "/x", Body: []byte("body")}, Options{}) {
		t.Error("no Content-Encoding changed the digest")
	}
}

// FuzzCanonicalJSON: canonicalisation never panics, is idempotent, and agrees
// with encoding/json about validity for inputs encoding/json accepts.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2,{"d":null,"c":true}]}`, `"\u00e9"`, `-1.5e3`, `[`, `{"a":1,"a":2}`, " \t\n{}\r"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := AppendCanonicalJSON(nil, in)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrDuplicateName) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		again, err := AppendCanonicalJSON(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %s -> %s -> %s (%v)", in, out, again, err)
		}
	})
}

func BenchmarkSum1KiBJSON(b *testing.B) {
	body := []byte(`{"amountCents":1234,"note":"` + strings.Repeat("n", 990) + `"}`)
	for _, js := range []bool{false, true} {
		name := "raw"
		if js {
			name = "json"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Sum(Request{Method: "POST", Route: "/api/accounts/1/deposit", Body: body}, Options{CanonicalJSON: js}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
