// Command nethttp serves the account API of docs/architecture.md section 6 with net/http: the
// account service (package accounts) behind the idempotency middleware.
//
//	go run ./examples/nethttp
//
// On embedded defaults it needs nothing else: the memory idempotency store, an
// in-process Celeriant simulator and the memory projection. Environment: ADDR,
// IDEM_STORE, DATABASE_URL, REDIS_URL, CELERIANT_ADDR, PROJECTION, IDEM_LEASE,
// IDEM_RETENTION (see package accountsapp). Routes:
//
//	GET  /api/accounts, /api/accounts/{id}/balance, /api/accounts/{id}/history
//	POST /api/accounts/{id}/deposit, /api/accounts/{id}/withdraw, /api/transfers
//	     (Idempotency-Key required; scope = X-Client-ID, else "anonymous")
//	GET  /healthz, /readyz, /metrics (Prometheus text format)
//
// It prints "listening on http://ADDR" once it accepts connections, and on SIGINT
// or SIGTERM lets in-flight requests finish before exiting.
package main

import (
	"net/http"

	"github.com/idemkey/idemkey/examples/internal/accountsapp"
)

func main() { accountsapp.Main("nethttp", newHandler) }

// newHandler routes the probes outside the middleware and /api behind it; any
// other path gets the API's 404 problem.
func newHandler(a *accountsapp.App) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", a.Healthz)
	mux.HandleFunc("/readyz", a.Readyz)
	mux.Handle("/metrics", a.MetricsHandler())
	mux.Handle("/api/", a.ProtectedAPI())
	mux.Handle("/", a.API)
	return mux
}
