// Package webui is a small web page for the account API: one HTML file, its style
// and script inline, nothing fetched from elsewhere. It makes the calls of the
// Celeriant reference's page (celeriant_reference/wwwroot/app.js of
// celeriant/celeriant-db at commit e7c6df9, docs/account-service.md section 1.6)
// with the same routes, bodies and field names, so a browser test of this page
// covers what that page needs from the API:
//
//   - GET /api/accounts, then GET /api/accounts/{id}/history for each account;
//   - POST /api/accounts/{id}/deposit and /withdraw with {"amountCents"}, and
//     POST /api/transfers with {"fromAccountId","toAccountId","amountCents"}, each
//     with Content-Type: application/json and an Idempotency-Key that is a fresh
//     crypto.randomUUID() per click, kept across the reference's one retry after a
//     network error (300 ms);
//   - on an error answer, the body's error (INSUFFICIENT_FUNDS, VALIDATION_ERROR,
//     CONFLICT, SERVICE_UNAVAILABLE) and message, shown as the reference shows them;
//   - the Watch button: EventSource('/api/watch/stream'), unnamed events whose
//     data carries aggregateId, each followed by a fetch of that account's history.
//
// Beyond the reference, it logs every write with its status, balance and version,
// has a "Deposit twice" control (the same deposit sent again with the same key
// 360 ms later, while the first is still running), and retries a 409
// request_in_flight after its Retry-After (up to 5 times) so that copy ends with
// the original's answer.
package webui

import (
	_ "embed"
	"net/http"
)

//go:embed index.html
var page []byte

// Handler serves the page (GET and HEAD).
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(page)
	})
}
