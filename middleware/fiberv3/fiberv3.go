// Package idemfiberv3 adapts the idempotency middleware (package middleware) to
// Fiber v3 (github.com/gofiber/fiber/v3); middleware/fiber is the same
// adapter for Fiber v2. It has no logic of its own: every
// decision of the table in docs/architecture.md section 3 is taken by
// (*middleware.Middleware).Handler, the same core net/http uses.
//
//	import idemfiberv3 "github.com/idemkey/idemkey/middleware/fiberv3"
//
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	...
//	api := app.Group("/api", idemfiberv3.Middleware(m))
//
// Fiber runs on fasthttp, not net/http. The adapter gives the core a
// net/http view of the Fiber request and writes the core's answer into
// Fiber's response; docs/adapters.md says why it does so itself rather than
// through Fiber's adaptor package. What it guarantees:
//
//   - The request the core sees is a copy: method, URI, host, remote address,
//     TLS state and every header line (a header sent twice stays two values,
//     so two Idempotency-Key lines are answered 400). No string aliases
//     fasthttp's recycled buffers. The body is read from the fasthttp request,
//     so the handler's c.Body() is the same bytes the fingerprint covered.
//   - The rest of the chain runs inside the core (c.Next). Fiber buffers a
//     response, so when the chain returns the adapter hands its status, every
//     header line and the body to the core, which stores it (or streams a body
//     over the storage cap) and writes it back into Fiber's response.
//   - A returned error is rendered by the application's error handler inside
//     the core, so the answer stored and replayed is the one the client gets
//     and a 5xx error releases the claim. The adapter then returns nil: Fiber
//     would otherwise render the error a second time over the stored answer.
//   - c.Context() inside the chain carries the scope and key
//     (KeyFromContext, or middleware.KeyFromContext(c.Context())) and the
//     core's deadlines; it is restored when the adapter returns, also on a
//     re-raised panic (a recover middleware outside then answers 500).
//   - Fiber's own 404 or 405 (no route ran after the adapter's) is marked
//     middleware.Unrouted, so it releases the key and the corrected request
//     with the same key runs. A handler's own 404 is stored and replayed, and
//     so is Fiber's 404 after a later app.Use middleware ran: register the
//     adapter last among app.Use, or on the group or route.
//
// fasthttp does not tell a handler that its client went away, so the core sees
// no disconnect (middleware.WithCancelOnDisconnect has no effect); the store
// timeouts bound every store call regardless.
package idemfiberv3

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// Middleware returns Fiber middleware running m in front of the rest of the
// chain. Use it with app.Use, app.Group or per route. Requests m does not
// protect (by default every method but POST and PATCH) pass through to the
// chain unchanged.
func Middleware(m *middleware.Middleware) fiber.Handler {
	// Marks Fiber's own 404 and 405 so that they release the key.
	unrouted := middleware.Unrouted(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return func(c fiber.Ctx) error {
		r, err := newRequest(c)
		if err != nil {
			return fiber.NewError(fiber.StatusBadRequest, "invalid request URI")
		}
		orig := c.Context()
		defer c.SetContext(orig) // also on a re-raised panic
		w := &responseWriter{resp: &c.RequestCtx().Response, h: make(http.Header)}
		m.Handler(http.HandlerFunc(func(hw http.ResponseWriter, hr *http.Request) {
			c.SetContext(hr.Context())
			route := c.Route()
			if err := c.Next(); err != nil {
				if c.Route() == route && isRouterError(err) {
					unrouted.ServeHTTP(hw, hr)
				}
				if err := c.App().ErrorHandler(c, err); err != nil {
					c.Status(fiber.StatusInternalServerError)
				}
			}
			handOver(&c.RequestCtx().Response, hw)
		})).ServeHTTP(w, r)
		return nil
	}
}

// KeyFromContext returns the scope and idempotency key of the request c serves,
// as the middleware parsed them; ok is false when the request passed through
// without one. It is middleware.KeyFromContext(c.Context()), valid inside
// the handler (and inner middleware).
func KeyFromContext(c fiber.Ctx) (id store.ID, ok bool) {
	return middleware.KeyFromContext(c.Context())
}

// isRouterError reports whether err is Fiber's answer to a request no route
// matched: 404 or 405 (the adapter checks that no later route ran).
func isRouterError(err error) bool {
	var fe *fiber.Error
	return errors.As(err, &fe) && (fe.Code == fiber.StatusNotFound || fe.Code == fiber.StatusMethodNotAllowed)
}

// newRequest is the net/http request the core sees for c, on c.Context().
// Every string is a copy: fasthttp reuses its buffers after the request, and
// the core and its store may keep the key and scope.
func newRequest(c fiber.Ctx) (*http.Request, error) {
	fc := c.RequestCtx()
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
		case fiber.HeaderHost:
		case fiber.HeaderTransferEncoding:
			r.TransferEncoding = append(r.TransferEncoding, string(v))
		default:
			r.Header.Add(key, string(v))
		}
	})
	return r.WithContext(c.Context()), nil
}

// handOver moves the response the chain left in resp (status, header lines,
// body) to w, the core's writer, which writes it back into resp.
func handOver(resp *fasthttp.Response, w http.ResponseWriter) {
	h := w.Header()
	resp.Header.VisitAll(func(k, v []byte) {
		switch key := string(k); key {
		case fiber.HeaderContentLength, fiber.HeaderConnection:
		default:
			h.Add(key, string(v))
		}
	})
	status := resp.StatusCode()
	// A copy: resetting the body returns fasthttp's buffer to its pool, and
	// the handler's own c.JSON body is not ours to keep.
	body := append([]byte(nil), resp.Body()...)
	resp.ResetBody()
	resp.Header.Reset()
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // writes into memory; the core reports a stream's failure itself
}

// responseWriter is the http.ResponseWriter the core writes to: the status and
// header lines go into Fiber's response with the first write, the body is
// appended to it (fasthttp sends it when the handler returns).
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
