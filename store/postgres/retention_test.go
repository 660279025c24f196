package postgres

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// TestSetRetentionInTransaction: a handler that sets its record's retention
// (claim.SetRetention) and completes it in its own transaction
// (CommitResponse) has the record kept that long.
func TestSetRetentionInTransaction(t *testing.T) {
	const keep = 30 * 24 * time.Hour
	e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
		inner := insertAndCommit(e)
		return func(w http.ResponseWriter, r *http.Request) {
			if err := claim.SetRetention(r.Context(), keep); err != nil {
				t.Error(err)
			}
			inner(w, r)
		}
	}, middleware.WithRecordRetention(policy.RetentionRule{Max: keep}))
	if code, _, _ := e.post("k1", "x"); code != 201 {
		t.Fatalf("first: %d", code)
	}
	info, err := e.st.Inspect(t.Context(), store.ID{Key: "k1"})
	if err != nil || info.State != store.StateCompleted {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	if d := info.ExpiresAt.Sub(info.CompletedAt); d < keep-time.Second || d > keep+time.Second {
		t.Fatalf("kept %v, want %v", d, keep)
	}
}
