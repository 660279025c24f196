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
//     so the handler's c.Body() is the body the fingerprint covered (decoded by
//     Fiber when it has a Content-Encoding; the fingerprint covers it as sent).
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
//     so is Fiber's 404 after a middleware registered after the adapter ran:
//     register the adapter last among app.Use and last in its app.Use or
//     app.Group call, or on the route.
//
// fasthttp does not tell a handler that its client went away, so the core sees
// no disconnect (middleware.WithCancelOnDisconnect has no effect); the store
// timeouts bound every store call regardless.
package idemfiberv3

import (
	"errors"
	"net/http"
	"reflect"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/middleware/internal/fasthttpbridge"
	"github.com/idemkey/idemkey/store"
)

// Middleware returns Fiber middleware running m in front of the rest of the
// chain. Use it with app.Use, app.Group or per route. Requests m does not
// protect (by default every method but POST and PATCH) pass through to the
// chain unchanged.
func Middleware(m *middleware.Middleware) fiber.Handler {
	// Marks Fiber's own 404 and 405 so that they release the key.
	unrouted := middleware.Unrouted(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var self fiber.Handler
	self = func(c fiber.Ctx) error {
		r, err := fasthttpbridge.Request(c.Context(), c.RequestCtx())
		if err != nil {
			return fiber.NewError(fiber.StatusBadRequest, "invalid request URI")
		}
		orig := c.Context()
		defer c.SetContext(orig) // also on a re-raised panic
		resp := &c.RequestCtx().Response
		w := fasthttpbridge.NewWriter(resp)
		defer fasthttpbridge.Release(w) // the core keeps neither it nor its header
		m.Handler(http.HandlerFunc(func(hw http.ResponseWriter, hr *http.Request) {
			c.SetContext(hr.Context())
			route := c.Route()
			if err := c.Next(); err != nil {
				if c.Route() == route && lastOn(route, self) && isRouterError(err) {
					unrouted.ServeHTTP(hw, hr)
				}
				if err := c.App().ErrorHandler(c, err); err != nil {
					c.Status(fiber.StatusInternalServerError)
				}
			}
			fasthttpbridge.HandOver(resp, hw)
		})).ServeHTTP(w, r)
		return nil
	}
	return self
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

// lastOn reports whether h is the last handler of route: only then did
// c.Next ask the router for a later route, so only then is a 404 or 405 with
// the route unchanged the router's. A handler after h on its route (the
// adapter registered per route) answers for itself, its 404 included.
// Handlers compare by code: every adapter is the same closure.
func lastOn(route *fiber.Route, h fiber.Handler) bool {
	hs := route.Handlers
	return len(hs) > 0 && reflect.ValueOf(hs[len(hs)-1]).Pointer() == reflect.ValueOf(h).Pointer()
}
