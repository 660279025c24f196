// Package idemechov5 adapts the idempotency middleware (package middleware) to
// echo v5 (github.com/labstack/echo/v5). It has no logic of its own: every
// decision of the table in docs/architecture.md section 3 is taken by
// (*middleware.Middleware).Handler, the same core net/http uses, and it behaves
// as the echo v4 adapter (package middleware/echo) does.
//
//	import idemechov5 "github.com/idemkey/idemkey/middleware/echov5"
//
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	...
//	api := e.Group("/api", idemechov5.Middleware(m))
//
// What the adapter guarantees, beyond echo.WrapMiddleware:
//
//   - A handler's returned error is rendered by the Echo's HTTPErrorHandler
//     inside the middleware, so the response the client gets is the one
//     captured, stored and replayed, and a 5xx error releases the claim. The
//     error is then returned up the chain: an HTTPErrorHandler must ignore a
//     committed response (echo.DefaultHTTPErrorHandler does, through
//     echo.UnwrapResponse).
//   - c.Request() inside the handler carries the scope and key
//     (middleware.KeyFromContext, or KeyFromContext here) and the body bytes the
//     middleware read for the fingerprint.
//   - c.Response() is restored to the writer it was when the middleware
//     returns; that writer saw exactly what was sent (status, size, Committed
//     of its *echo.Response). c.Request() is restored too, since the
//     middleware's request body is pooled.
//   - Path parameters (c.Param), the Context and its values are untouched.
package idemechov5

import (
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// Middleware returns echo v5 middleware running m in front of the next handler.
// Use it with e.Use, e.Group or per route. Requests m does not protect (by
// default every method but POST and PATCH) pass through to next unchanged.
func Middleware(m *middleware.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) (err error) {
			origReq, origResp := c.Request(), c.Response()
			defer func() {
				// Also on a re-raised panic: the handler's request and writer are the
				// middleware's pooled ones.
				c.SetRequest(origReq)
				c.SetResponse(origResp)
			}()
			m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				// w writes through to origResp. A fresh *echo.Response over it tells
				// the error handler whether the handler already answered.
				c.SetResponse(echo.NewResponse(w, c.Logger()))
				if err = next(c); err != nil {
					c.Echo().HTTPErrorHandler(c, err)
				}
			})).ServeHTTP(origResp, origReq)
			return err
		}
	}
}

// KeyFromContext returns the scope and idempotency key of the request c serves,
// as the middleware parsed them; ok is false when the request passed through
// without one. It is middleware.KeyFromContext(c.Request().Context()), valid
// inside the handler (and inner middleware).
func KeyFromContext(c *echo.Context) (id store.ID, ok bool) {
	return middleware.KeyFromContext(c.Request().Context())
}
