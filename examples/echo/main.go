// Command echo serves the account API of docs/architecture.md section 6 with echo v4: the same
// account service, middleware and environment as examples/nethttp (package
// accountsapp), with the middleware attached through the echo adapter
// (middleware/echo) on the /api group.
//
//	go run ./examples/echo
//
// It prints "listening on http://ADDR" once it accepts connections, and on SIGINT
// or SIGTERM lets in-flight requests finish before exiting.
package main

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
)

func main() { accountsapp.Main("echo", newHandler) }

// newHandler routes with echo: the probes outside the middleware, the API routes in
// an /api group behind accountsapp.ScopeGuard and the middleware. Echo routes the
// requests; the account handler serves them (it reads the path itself). Anything
// else under /api reaches the account handler too, so 404 and 405 answers match
// the net/http server's.
func newHandler(a *accountsapp.App) http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = problemErrors(a.Logger)
	e.Any("/healthz", echo.WrapHandler(http.HandlerFunc(a.Healthz)))
	e.Any("/readyz", echo.WrapHandler(http.HandlerFunc(a.Readyz)))
	e.Any("/metrics", echo.WrapHandler(a.MetricsHandler()))

	api := echo.WrapHandler(a.API)
	g := e.Group("/api", echo.WrapMiddleware(accountsapp.ScopeGuard), idemecho.Middleware(a.Idempotency))
	g.GET("/accounts", api)
	g.GET("/accounts/:id/balance", api)
	g.GET("/accounts/:id/history", api)
	g.POST("/accounts/:id/deposit", api)
	g.POST("/accounts/:id/withdraw", api)
	g.POST("/transfers", api)
	g.Any("/*", api)
	return e
}

// problemErrors renders echo's own errors (unknown route, wrong method) as the
// problem details the account API answers. A committed response was already
// rendered (inside the idempotency middleware) and is left alone.
func problemErrors(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		writeEchoError(logger, err, c)
	}
}

func writeEchoError(logger *slog.Logger, err error, c echo.Context) {
	status, code, detail := http.StatusInternalServerError, "INTERNAL_ERROR", "Internal error."
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			status, code, detail = he.Code, "NOT_FOUND", "No such route."
		case http.StatusMethodNotAllowed:
			status, code, detail = he.Code, "METHOD_NOT_ALLOWED", "Method not allowed on this route."
		case http.StatusRequestEntityTooLarge:
			status, code, detail = he.Code, "PAYLOAD_TOO_LARGE", "Request body is too large."
		default:
			if he.Code >= 400 && he.Code < 500 {
				status, code, detail = he.Code, "MALFORMED_REQUEST", http.StatusText(he.Code)+"."
			}
		}
	}
	if status == http.StatusInternalServerError {
		logger.ErrorContext(c.Request().Context(), "echo: internal error", "err", err)
	}
	accountsapp.WriteProblem(c.Response(), status, code, detail)
}
