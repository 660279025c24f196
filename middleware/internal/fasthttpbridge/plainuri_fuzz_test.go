package fasthttpbridge

import (
	"net/url"
	"reflect"
	"testing"
)

// FuzzPlainURI: whenever the fast path takes a request URI, its URL is the one
// url.ParseRequestURI returns (a fast path that took a URI the parser refuses,
// or read one differently, would route, fingerprint or scope by another URL).
func FuzzPlainURI(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/p?", "/p?a=1&b=2", "//x", "///x", "/p??", "/a%2Fb", "*",
		"", "/p#f", "/p?a+b", "/p?a;b", "/p?%zz", "http://h/p", "h:443", "/\xc3\xa9", "/p?\xc3\xa9",
		"/p?a b", "/.", "/..", "/~", "/p?#", "/p?a=%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		var got url.URL
		if !parsePlainURI(&got, uri) {
			return
		}
		want, err := url.ParseRequestURI(uri)
		if err != nil || !reflect.DeepEqual(&got, want) {
			t.Fatalf("%q: fast path %#v, url.ParseRequestURI %#v, %v", uri, got, want, err)
		}
		if got.String() != want.String() || got.RequestURI() != want.RequestURI() {
			t.Fatalf("%q: String/RequestURI differ", uri)
		}
	})
}
