// Package fasthttpbridge is the part of the Fiber adapters (middleware/fiber for
// Fiber v2, middleware/fiberv3 for v3) that speaks fasthttp, which both Fiber
// versions run on: the net/http request the core sees, the writer it answers
// through, and the hand-over of the response Fiber buffered. It is its own
// module so that the core keeps no dependency and each adapter brings only its
// own Fiber; docs/adapters.md ("Fiber") says what the adapters guarantee.
package fasthttpbridge

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"
)

// Request is the net/http request the core sees for fc, on ctx. Every string
// is a copy: fasthttp reuses its buffers after the request, and the core and
// its store may keep the key and scope. Every header line stays a line (two
// Idempotency-Key lines are two values). The body is fasthttp's: read here, it
// is the same bytes the handler reads. An error when the request URI does
// not parse.
func Request(ctx context.Context, fc *fasthttp.RequestCtx) (*http.Request, error) {
	var lb lineBuf
	lines := lb[:0]
	fc.Request.Header.VisitAll(func(k, v []byte) {
		if string(k) != "Host" {
			lines = append(lines, line{k, v})
		}
	})
	// One copy of every string: method, URI, host, remote address, then the
	// header lines (copyLines).
	method, uri, host := fc.Method(), fc.RequestURI(), fc.Host()
	var buf [512]byte
	b := append(append(append(buf[:0], method...), uri...), host...)
	b = appendRemoteAddr(b, fc.RemoteAddr())
	head := len(b)
	all := string(appendLines(b, lines))
	out := &request{}
	r := &out.r
	*r = http.Request{Method: all[:len(method)], RequestURI: all[len(method) : len(method)+len(uri)],
		Host: all[len(method)+len(uri) : len(method)+len(uri)+len(host)], RemoteAddr: all[len(method)+len(uri)+len(host) : head],
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, TLS: fc.TLSConnectionState()}
	if !parsePlainURI(&out.u, r.RequestURI) {
		u, err := url.ParseRequestURI(r.RequestURI)
		if err != nil {
			return nil, err
		}
		out.u = *u
	}
	r.URL = &out.u
	r.Header = make(http.Header, len(lines))
	copyLines(r.Header, lines, all[head:], out.values[:0])
	if te, ok := r.Header["Transfer-Encoding"]; ok { // a field of its own, as net/http's server does
		r.TransferEncoding = te
		delete(r.Header, "Transfer-Encoding")
	}
	body := fc.PostBody()
	out.br.Reset(body)
	r.ContentLength, r.Body = int64(len(body)), &out.br
	// Fiber's user context is context.Background() unless the app set one:
	// then the request is already what WithContext would return.
	if ctx == context.Background() {
		return r, nil
	}
	return r.WithContext(ctx), nil
}

// request is the request Request returns, in one allocation with its body
// reader and the array its header values share (a request with more values
// than it holds allocates them).
type request struct {
	r      http.Request
	u      url.URL
	br     bodyReader
	values [12]string
}

// parsePlainURI sets u to what url.ParseRequestURI returns for uri, and
// returns true, when uri is a plain request URI: a path of letters, digits,
// "-._~/" (nothing to unescape, so no RawPath) starting with "/", then
// optionally "?" and a query of printable ASCII without "#" (kept as sent). Any
// other URI returns false, for url.ParseRequestURI to parse.
func parsePlainURI(u *url.URL, uri string) bool {
	if uri == "" || uri[0] != '/' {
		return false
	}
	path, query, hasQuery := strings.Cut(uri, "?")
	for i := range len(path) {
		if c := path[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
			return false
		}
	}
	for i := range len(query) {
		if c := query[i]; c <= ' ' || c >= 0x7f || c == '#' || c == '?' {
			return false
		}
	}
	*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
	return true
}

// appendRemoteAddr appends addr.String(), without an allocation of its own
// for the TCP address of a client (net.TCPAddr.String takes two).
func appendRemoteAddr(b []byte, addr net.Addr) []byte {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.Zone != "" || ta.Port < 0 || ta.Port > 65535 {
		return append(b, addr.String()...)
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return append(b, addr.String()...)
	}
	// net.IP.String prints an IPv4-mapped address as IPv4
	return netip.AddrPortFrom(ip.Unmap(), uint16(ta.Port)).AppendTo(b)
}

// line is a header line as fasthttp yields it: valid only during the visit.
type line struct{ k, v []byte }

// lineBuf holds the lines of a visit; a request with more spills to the heap.
type lineBuf [24]line

// appendLines appends every line's name and value, in order: the copy
// copyLines slices.
func appendLines(b []byte, lines []line) []byte {
	for _, l := range lines {
		b = append(append(b, l.k...), l.v...)
	}
	return b
}

// copyLines puts lines into h: names canonical, a repeated line a second
// value. all is appendLines's copy of the lines, which the names and values
// share; values, their array (each value capacity-limited, so an append to it
// reallocates), from values[:0] (grown on the heap when too small).
func copyLines(h http.Header, lines []line, all string, values []string) {
	if cap(values) < len(lines) {
		values = make([]string, 0, len(lines))
	}
	for _, l := range lines {
		key := textproto.CanonicalMIMEHeaderKey(all[:len(l.k)]) // no copy when canonical already
		val := all[len(l.k) : len(l.k)+len(l.v)]
		all = all[len(l.k)+len(l.v):]
		if vs, ok := h[key]; ok {
			h[key] = append(vs, val)
			continue
		}
		values = append(values, val)
		h[key] = values[len(values)-1 : len(values) : len(values)]
	}
}

// copyOf puts copies of lines into h (copyLines): two allocations whatever
// the number of lines, where a copy per line cost three each.
func copyOf(h http.Header, lines []line) {
	if len(lines) == 0 {
		return
	}
	copyLines(h, lines, string(appendLines(nil, lines)), nil)
}

// bodyReader is the request body: fasthttp's bytes, read once by the core.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// HandOver moves the response the chain left in resp (status, header lines,
// body) to w, the core's writer (from NewWriter), which writes it back into
// resp.
func HandOver(resp *fasthttp.Response, w http.ResponseWriter) {
	h := w.Header()
	clear(h) // the outer lines are in resp too, as the chain left them
	var buf lineBuf
	lines := buf[:0]
	resp.Header.VisitAll(func(k, v []byte) {
		if string(k) != "Content-Length" && string(k) != "Connection" {
			lines = append(lines, line{k, v})
		}
	})
	copyOf(h, lines)
	status := resp.StatusCode()
	// A copy: resetting the body returns fasthttp's buffer to its pool, and
	// the handler's own c.JSON body is not ours to keep.
	body := append([]byte(nil), resp.Body()...)
	resp.ResetBody()
	for k := range h {
		resp.Header.Del(k) // not Reset, which drops the app's settings (DisableDefaultContentType)
	}
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // writes into memory; the core reports a stream's failure itself
}

// NewWriter returns the http.ResponseWriter the core writes resp through. Its
// header starts with the lines outer middleware set in resp before the
// adapter ran (a request id, CORS): the core finds them there, as it finds an
// outer net/http middleware's, and neither stores nor replays them.
func NewWriter(resp *fasthttp.Response) http.ResponseWriter {
	var buf lineBuf
	lines := buf[:0]
	resp.Header.VisitAll(func(k, v []byte) {
		switch string(k) {
		case "Content-Type", "Content-Length", "Connection":
			// fasthttp reports a default Content-Type when none was set
		default:
			lines = append(lines, line{k, v})
		}
	})
	w, _ := writers.Get().(*responseWriter)
	if w == nil {
		w = &responseWriter{h: make(http.Header, len(lines))}
	}
	w.resp, w.outer = resp, len(lines) > 0
	copyOf(w.h, lines)
	return w
}

// writers keeps the writers Release gave back, with their header maps: a
// replay sets its headers in a map that already has room for them.
var writers sync.Pool

// maxPooledHeader bounds the header names of a writer Release keeps.
const maxPooledHeader = 32

// Release gives w, from NewWriter, back for another request. Call it once the
// core returned, and use w no more: an adapter hands the writer to the core
// only, which keeps neither it nor its header map and hands the map to no
// hook (ReplayRule.OnReplay gets a map of its own; a response the core stores
// keeps the values, which Release does not change).
func Release(w http.ResponseWriter) {
	rw, ok := w.(*responseWriter)
	if !ok || len(rw.h) > maxPooledHeader {
		return
	}
	clear(rw.h)
	*rw = responseWriter{h: rw.h}
	writers.Put(rw)
}

// responseWriter puts the status and header lines into resp with the first
// write and appends the body to it (fasthttp sends it when the handler
// returns).
type responseWriter struct {
	resp  *fasthttp.Response
	h     http.Header
	wrote bool
	// outer: resp had lines of outer middleware when the core began, which
	// the core's values of the same name replace. Without (most requests)
	// resp has no line of any name the core sets: HandOver took the chain's.
	outer bool
}

func (w *responseWriter) Header() http.Header { return w.h }

func (w *responseWriter) WriteHeader(code int) {
	if w.wrote || code < 200 { // 1xx: fasthttp sends no informational answer
		return
	}
	w.wrote = true
	w.resp.SetStatusCode(code)
	for k, vs := range w.h {
		if w.outer {
			w.resp.Header.Del(k) // an outer line, replaced by the core's values
		}
		for _, v := range vs {
			w.resp.Header.Add(k, v)
		}
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.resp.AppendBody(p)
	return len(p), nil
}
