// Package idemgin adapts the idempotency middleware (package middleware) to gin
// (github.com/gin-gonic/gin). It has no logic of its own: every decision of the
// table in docs/architecture.md section 3 is taken by
// (*middleware.Middleware).Handler, the same core net/http uses.
//
//	import idemgin "github.com/idemkey/idemkey/middleware/gin"
//
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	...
//	api := r.Group("/api", idemgin.Middleware(m))
//
// A net/http middleware cannot see a gin handler's response, since gin writes
// through c.Writer; the adapter is what makes capture work. What it guarantees:
//
//   - While the rest of the chain runs (c.Next), c.Writer is a gin.ResponseWriter
//     over the middleware's capture writer, with gin's semantics (a status is
//     sent with the first body byte or WriteHeaderNow, Written, Status, Size),
//     so everything the handlers write, c.JSON and c.AbortWithStatusJSON
//     included, is what is stored and replayed. A status set without a body
//     (c.Status) is sent when the chain returns.
//   - When the middleware answers itself (a replay, 400, 409, 413, 422, 503) the
//     chain is aborted (c.Abort): no later handler runs.
//   - c.Request inside the chain carries the scope and key (KeyFromContext, or
//     middleware.KeyFromContext(c.Request.Context())) and the body bytes the
//     middleware read for the fingerprint.
//   - A request no route matched (gin's own 404 or 405, c.FullPath() empty: the
//     middleware is then global, r.Use) is marked middleware.Unrouted, so that
//     answer releases the key and the corrected request with the same key runs.
//   - c.Writer and c.Request are restored when the middleware returns, also
//     on a re-raised panic (gin.Recovery outside then answers 500); the
//     restored c.Writer reports the status and size that were sent.
//
// Errors collected with c.Error are not responses: a middleware that renders
// c.Errors must run inside this one (registered after it), or its answer is not
// the one stored.
package idemgin

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// Middleware returns gin middleware running m in front of the rest of the
// chain. Use it with r.Use, r.Group or per route. Requests m does not protect
// (by default every method but POST and PATCH) pass through to the chain
// unchanged.
func Middleware(m *middleware.Middleware) gin.HandlerFunc {
	// Marks a request no route matched, so its 404 or 405 releases the key.
	unrouted := middleware.Unrouted(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return func(c *gin.Context) {
		origW, origReq := c.Writer, c.Request
		ran := false
		defer func() {
			// Also on a re-raised panic: the chain's request and writer are the
			// middleware's pooled ones.
			c.Writer, c.Request = origW, origReq
		}()
		m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			if c.FullPath() == "" {
				unrouted.ServeHTTP(w, r)
			}
			c.Request = r
			// The status gin may have set before the chain (404 or 405 when no route
			// matched) is the chain's starting status, as on gin's own writer.
			cw := &responseWriter{ResponseWriter: w, orig: origW, size: noWritten, status: origW.Status()}
			c.Writer = cw
			c.Next()
			if body, ok := noRouteBody[cw.status]; ok && !cw.Written() && c.FullPath() == "" {
				// gin writes its default answer after the chain, too late for capture.
				cw.Header()["Content-Type"] = []string{"text/plain"}
				cw.WriteString(body)
			}
			cw.WriteHeaderNow()
		})).ServeHTTP(origW, origReq)
		if !ran {
			c.Abort()
		}
	}
}

// KeyFromContext returns the scope and idempotency key of the request c serves,
// as the middleware parsed them; ok is false when the request passed through
// without one. It is middleware.KeyFromContext(c.Request.Context()), valid in
// the handlers and middleware after this one.
func KeyFromContext(c *gin.Context) (id store.ID, ok bool) {
	return middleware.KeyFromContext(c.Request.Context())
}

const noWritten = -1

// noRouteBody is what gin answers when no route matched and nothing in the chain
// wrote a body.
var noRouteBody = map[int]string{http.StatusNotFound: "404 page not found", http.StatusMethodNotAllowed: "405 method not allowed"}

var errHijackAfterBody = errors.New("idemkey/middleware/gin: hijack after the response body was written")

// responseWriter is gin's writer semantics over the middleware's writer.
type responseWriter struct {
	http.ResponseWriter
	orig   gin.ResponseWriter // the connection's writer: CloseNotify, Pusher
	size   int                // noWritten until the status is sent
	status int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WriteHeader records the status; it is sent with the first body byte or
// WriteHeaderNow. A status after that is ignored, as gin does.
func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *responseWriter) Status() int   { return w.status }
func (w *responseWriter) Size() int     { return w.size }
func (w *responseWriter) Written() bool { return w.size != noWritten }

// Hijack hands over the connection (the middleware then releases the claim);
// like gin, not once body bytes were written.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackAfterBody
	}
	if w.size < 0 {
		w.size = 0
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// CloseNotify is the connection's, as gin's own writer has it.
func (w *responseWriter) CloseNotify() <-chan bool { return w.orig.CloseNotify() }

// Pusher is the connection's server push, if any; pushed responses are not
// part of the stored response.
func (w *responseWriter) Pusher() http.Pusher { return w.orig.Pusher() }
