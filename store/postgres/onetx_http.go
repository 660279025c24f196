package postgres

import (
	"bytes"
	"context"
	"net/http"
)

// Route returns the one-transaction form of the route h: protect is the
// idempotency middleware built on t (the method value mw.Handler of
// middleware.New(t, ...)), and Route wraps protect(h), so the request's claim,
// every statement h runs in the transaction of TxFromContext, and the record
// commit together, once (docs/architecture.md section 9.1):
//
//	ts, err := st.OneTx(pool)                       // st: the Postgres Store
//	mw, err := middleware.New(ts, scope)            // the store of every route
//	mux.Handle("POST /orders", ts.Route(mw.Handler, orders)) // one transaction
//	mux.Handle("POST /refunds", mw.Handler(refunds)) // default: claim committed first
//
// The route holds a pooled connection and the record's row lock while h runs,
// so it suits a handler that only touches this database; a handler that calls
// another service keeps the default mode.
//
// h answers as usual through its ResponseWriter, and the answer reaches the
// client only after the commit (Flush, Hijack and 1xx responses are not passed
// on): a 2xx/4xx answer commits with the record and every retry replays it; an
// answer the middleware releases the key for (5xx, 408, 409, 425, 429, a panic)
// rolls the transaction back, so none of h's rows exist and the retry runs. When
// the commit fails or its outcome is unknown, the client gets 503
// store_unavailable with Retry-After: 1 instead of h's answer; its retry replays
// the record if the commit did happen, or runs. protect and h must not be nil
// (Route calls protect at once, like http.Handle, it fails while the routes are
// set up).
func (t *TxStore) Route(protect func(http.Handler) http.Handler, h http.Handler) http.Handler {
	inner := protect(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slot := &txSlot{}
		hw := &holdWriter{header: w.Header().Clone()}
		if hw.header == nil {
			hw.header = make(http.Header)
		}
		func() {
			defer func() { // the middleware neither completed nor released (or panicked)
				slot.take(true).end()
			}()
			inner.ServeHTTP(hw, r.WithContext(context.WithValue(r.Context(), txKey{}, slot)))
		}()
		slot.wait() // a completion still under way decides the answer
		if slot.hasFailed() {
			writeUnavailable(w)
			return
		}
		hw.send(w)
	})
}

// unavailableBody is the middleware's store_unavailable problem (RFC 9457),
// for a transaction that did not commit.
const unavailableBody = `{"type":"urn:idemkey:problem:store_unavailable","title":"Idempotency store unavailable","status":503,` +
	`"detail":"The request's transaction did not commit; retry after the Retry-After delay.","code":"store_unavailable"}` + "\n"

func writeUnavailable(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(unavailableBody))
}

// holdWriter keeps a response (final status, headers, body) until send.
type holdWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *holdWriter) Header() http.Header { return h.header }

func (h *holdWriter) WriteHeader(code int) {
	if h.status == 0 && code >= 200 {
		h.status = code
	}
}

func (h *holdWriter) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return h.body.Write(p)
}

// send writes the held response to w, its headers replacing w's.
func (h *holdWriter) send(w http.ResponseWriter) {
	dst := w.Header()
	for k := range dst {
		if _, ok := h.header[k]; !ok {
			delete(dst, k)
		}
	}
	for k, v := range h.header {
		dst[k] = v
	}
	if h.status == 0 {
		h.status = http.StatusOK
	}
	w.WriteHeader(h.status)
	if h.body.Len() > 0 {
		_, _ = w.Write(h.body.Bytes())
	}
}
