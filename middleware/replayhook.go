package middleware

import (
	"net/http"

	"github.com/idemkey/idemkey/store"
)

// WithOnReplay calls hook before each replayed response is written, with the
// replaying request and the response header, which already holds the stored
// headers: the application may add this request's own headers (a request id, a
// rate-limit header) or count a business metric. It cannot change the stored
// status or body, and the header it gets holds copies of the stored values, so
// no change reaches the record other replays get. After it, the replay mark
// (WithReplayedHeader, WithOmittedHeader) is set again and a Content-Length it set
// is dropped (net/http sets the stored body's). The request's body has been read
// by the middleware; hook must not read it. hook runs on the request's
// goroutine, concurrently for concurrent replays. Nil: no hook (a replay still
// sends copies of the stored values). See docs/request-rules.md section 2.
func WithOnReplay(hook func(r *http.Request, h http.Header)) Option {
	return func(c *config) { c.onReplay = hook }
}

// replayHeader sets rec's headers on h for a replay to r, through the hook of
// WithOnReplay when there is one.
func (m *Middleware) replayHeader(h http.Header, c *call, r *http.Request, rec *store.Record) {
	c.copyRecordHeader(h, rec) // copies: neither the hook nor an outer middleware can change the record
	if m.onReplay == nil {
		return
	}
	m.onReplay(r, h)
	delete(h, "Content-Length")
}
