package middleware

import (
	"net/http"

	"github.com/idemkey/idemkey/store"
)

// replayHeader sets rec's headers on h for a replay to r, through the hook of
// ReplayRule.OnReplay when there is one.
func (m *Middleware) replayHeader(h http.Header, c *call, r *http.Request, rec *store.Record) {
	c.copyRecordHeader(h, rec) // copies: neither the hook nor an outer middleware can change the record
	if m.onReplay == nil {
		return
	}
	m.onReplay(r, h)
	delete(h, "Content-Length")
}
