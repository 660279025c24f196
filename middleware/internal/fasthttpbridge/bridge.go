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
	"io"
	"net/http"
	"net/url"

	"github.com/valyala/fasthttp"
)

// Request is the net/http request the core sees for fc, on ctx. Every string
// is a copy: fasthttp reuses its buffers after the request, and the core and
// its store may keep the key and scope. Every header line stays a line (two
// Idempotency-Key lines are two values). The body is fasthttp's: read here, it
// is the same bytes the handler reads. An error when the request URI does
// not parse.
func Request(ctx context.Context, fc *fasthttp.RequestCtx) (*http.Request, error) {
	uri := string(fc.RequestURI())
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, err
	}
	body := fc.PostBody()
	r := &http.Request{
		Method: string(fc.Method()), URL: u, RequestURI: uri,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header), Host: string(fc.Host()),
		RemoteAddr: fc.RemoteAddr().String(), TLS: fc.TLSConnectionState(),
		ContentLength: int64(len(body)), Body: io.NopCloser(bytes.NewReader(body)),
	}
	fc.Request.Header.VisitAll(func(k, v []byte) {
		switch key := string(k); key {
		case "Host":
		case "Transfer-Encoding":
			r.TransferEncoding = append(r.TransferEncoding, string(v))
		default:
			r.Header.Add(key, string(v))
		}
	})
	return r.WithContext(ctx), nil
}

// HandOver moves the response the chain left in resp (status, header lines,
// body) to w, the core's writer (from NewWriter), which writes it back into
// resp.
func HandOver(resp *fasthttp.Response, w http.ResponseWriter) {
	h := w.Header()
	clear(h) // the outer lines are in resp too, as the chain left them
	resp.Header.VisitAll(func(k, v []byte) {
		switch key := string(k); key {
		case "Content-Length", "Connection":
		default:
			h.Add(key, string(v))
		}
	})
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
	h := make(http.Header)
	resp.Header.VisitAll(func(k, v []byte) {
		switch key := string(k); key {
		case "Content-Type", "Content-Length", "Connection":
			// fasthttp reports a default Content-Type when none was set
		default:
			h.Add(key, string(v))
		}
	})
	return &responseWriter{resp: resp, h: h}
}

// responseWriter puts the status and header lines into resp with the first
// write and appends the body to it (fasthttp sends it when the handler
// returns).
type responseWriter struct {
	resp  *fasthttp.Response
	h     http.Header
	wrote bool
}

func (w *responseWriter) Header() http.Header { return w.h }

func (w *responseWriter) WriteHeader(code int) {
	if w.wrote || code < 200 { // 1xx: fasthttp sends no informational answer
		return
	}
	w.wrote = true
	w.resp.SetStatusCode(code)
	for k, vs := range w.h {
		w.resp.Header.Del(k) // an outer line, replaced by the core's values
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
