package middleware

import (
	"maps"
	"net/http"

	"github.com/idemkey/idemkey/store"
)

// replayHeader sets rec's headers on h for a replay to r, through the hook of
// ReplayRule.OnReplay when there is one. The hook gets a map of its own, then
// copied into h: h is the writer's, which an adapter may reuse for a later
// request once this one is answered (the Fiber adapters pool their writers),
// and a hook may keep what it gets (an audit written from a goroutine).
func (m *Middleware) replayHeader(h http.Header, c *call, r *http.Request, rec *store.Record) {
	if m.onReplay == nil {
		c.copyRecordHeader(h, rec) // copies: an outer middleware cannot change the record
		return
	}
	own := make(http.Header, len(h)+len(rec.Header)+1)
	maps.Copy(own, h)
	c.copyRecordHeader(own, rec) // copies: nor can the hook
	m.onReplay(r, own)
	delete(own, "Content-Length")
	clear(h)
	maps.Copy(h, own)
}
