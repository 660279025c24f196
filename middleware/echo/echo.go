// Package idemecho adapts the idempotency middleware (package middleware) to echo v4.
// It has no logic of its own: every decision of the table in docs/architecture.md section 3 is
// taken by (*middleware.Middleware).Handler, the same core net/http uses.
//
//	import idemecho "github.com/idemkey/idemkey/middleware/echo"
//
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	...
//	api := e.Group("/api", idemecho.Middleware(m))
//
// What the adapter guarantees, beyond echo.WrapMiddleware:
//
//   - A handler's returned error is rendered by echo's HTTPErrorHandler inside the
//     middleware (c.Error), so the response the client gets is the one captured,
//     stored and replayed, and a 5xx error releases the claim. The error is then
//     returned up the chain, as echo's own Logger and BodyDump middleware do: an
//     HTTPErrorHandler must ignore a committed response (echo's default does).
//   - c.Request() inside the handler carries the scope and key
//     (middleware.KeyFromContext, or KeyFromContext here) and the body bytes the
//     middleware read for the fingerprint.
//   - c.Response() is restored to echo's own *echo.Response when the middleware
//     returns, with the status, size and Committed flag of what was sent; c.Request()
//     is restored too, since the middleware's request body is pooled.
//   - Path parameters (c.Param), the echo.Context and its values are untouched.
package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// Middleware returns echo middleware running m in front of the next handler. Use it
// with e.Use, e.Group or per route. Requests m does not protect (by default every
// method but POST and PATCH) pass through to next unchanged.
func Middleware(m *middleware.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			origReq, origResp := c.Request(), c.Response()
			defer func() {
				// Also on a re-raised panic: the handler's request and writer are the
				// middleware's pooled ones.
				c.SetRequest(origReq)
				c.SetResponse(origResp)
			}()
			m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				// w writes through to origResp, which so records status, size and
				// Committed as usual.
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				if err = next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(origResp, origReq)
			return err
		}
	}
}

// KeyFromContext returns the scope and idempotency key of the request c serves, as
// the middleware parsed them; ok is false when the request passed through without
// one. It is middleware.KeyFromContext(c.Request().Context()), valid inside the
// handler (and inner middleware).
func KeyFromContext(c echo.Context) (id store.ID, ok bool) {
	return middleware.KeyFromContext(c.Request().Context())
}
