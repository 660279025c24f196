package middleware

import (
	"net/http"
	"net/url"
	"path"
)

// muxRedirect reports whether a ServeMux's answer (status, header) to r is its
// own redirect to the canonical form of r's path: a 3xx whose Location has r's
// query and, as its path, r's cleaned path when that differs from r's, or r's
// cleaned path with a '/' appended (a subtree pattern such as "/dir/" asked for
// as "/dir"). The mux names the pattern it redirects to, so r.Pattern alone
// cannot tell this answer from a route's. An application's own redirect to
// exactly that place is taken for the router's: releasing its key costs one more
// run of a handler that redirects.
func muxRedirect(r *http.Request, status int, h http.Header) bool {
	if status < 300 || status > 399 {
		return false
	}
	loc := h["Location"]
	if len(loc) != 1 {
		return false
	}
	u, err := url.Parse(loc[0])
	if err != nil || u.Scheme != "" || u.Host != "" || u.RawQuery != r.URL.RawQuery {
		return false
	}
	sent := r.URL.EscapedPath()
	clean := canonicalPath(sent)
	got := u.EscapedPath()
	return got == clean+"/" && clean[len(clean)-1] != '/' || clean != sent && got == clean
}

// canonicalPath is p as a ServeMux routes it: rooted, with "." and ".."
// elements and repeated slashes removed, a trailing slash kept.
func canonicalPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c
}
