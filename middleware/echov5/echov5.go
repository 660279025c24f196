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
//   - echo's own 404 and 405 (no route matched: a not-found route, a group's
//     catch-all included, or the method-not-allowed answer) are marked
//     middleware.Unrouted, so they release the key and the corrected request
//     with the same key runs. A handler's own 404 is stored and replayed.
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
	// Marks echo's own 404 and 405 so that they release the key.
	unrouted := middleware.Unrouted(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
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
				resp := echo.NewResponse(w, c.Logger())
				c.SetResponse(resp)
				if err = next(c); err != nil {
					c.Echo().HTTPErrorHandler(c, err)
				}
				if (resp.Status == http.StatusNotFound || resp.Status == http.StatusMethodNotAllowed) && routerAnswer(c) {
					unrouted.ServeHTTP(w, r)
				}
			})).ServeHTTP(origResp, origReq)
			return err
		}
	}
}

// routerAnswer reports whether c's route is echo's own answer to a request no
// route matched: a not-found route (a group's catch-all included) or the 405.
func routerAnswer(c *echo.Context) bool {
	ri := c.RouteInfo()
	return ri.Method == echo.RouteNotFound || ri.Name == echo.NotFoundRouteName || ri.Name == echo.MethodNotAllowedRouteName
}

// KeyFromContext returns the scope and idempotency key of the request c serves,
// as the middleware parsed them; ok is false when the request passed through
// without one. It is middleware.KeyFromContext(c.Request().Context()), valid
// inside the handler (and inner middleware).
func KeyFromContext(c *echo.Context) (id store.ID, ok bool) {
	return middleware.KeyFromContext(c.Request().Context())
}
