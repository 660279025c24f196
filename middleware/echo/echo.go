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
//   - echo's own 404 and 405 (no route matched: no route at all, a not-found
//     route such as a group's catch-all, or the method-not-allowed answer) are
//     marked middleware.Unrouted, so they release the key and the corrected
//     request with the same key runs. A handler's own 404 is stored and
//     replayed. An answer is echo's own when the request's router (the host's,
//     else the default) lists no route for the request's method on the matched
//     path (c.Path()); the routes are looked up only for the 404 and 405 answers
//     of keyed requests. The application's own RouteNotFound handlers count as
//     echo's (their 404 releases the key). Routes added with e.Router().Add are
//     not listed by echo (Router.Routes), so a 404 of theirs releases the key
//     too: add routes with e.Add, e.POST and the like.
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
	// Marks echo's own 404 and 405 so that they release the key.
	unrouted := middleware.Unrouted(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
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
				resp := echo.NewResponse(w, c.Echo())
				c.SetResponse(resp)
				if err = next(c); err != nil {
					c.Error(err)
				}
				// Only a keyed request has a claim to release, so only its 404 or 405
				// pays for the routes' look-up.
				if (resp.Status == http.StatusNotFound || resp.Status == http.StatusMethodNotAllowed) && keyed(r) && routerAnswer(c, r) {
					unrouted.ServeHTTP(w, r)
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

// keyed reports whether r carries a claimed idempotency key.
func keyed(r *http.Request) bool {
	_, ok := middleware.KeyFromContext(r.Context())
	return ok
}

// routerAnswer reports whether c's 404 or 405 is echo's own answer to a request
// no route matched: the request's router has no route for r's method on the
// path it matched (none at all, a not-found route such as a group's
// catch-all, or a path registered for other methods only).
func routerAnswer(c echo.Context, r *http.Request) bool {
	path := c.Path()
	if path == "" {
		return true
	}
	e := c.Echo()
	router := e.Router()
	if hr, ok := e.Routers()[r.Host]; ok {
		router = hr
	}
	for _, rt := range router.Routes() {
		if rt.Method == r.Method && rt.Path == path {
			return false
		}
	}
	return true
}
