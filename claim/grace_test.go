package claim_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// slowRefusal answers Complete after 2 s (past the answer grace) with err.
type slowRefusal struct {
	store.Store
	err error
}

func (s slowRefusal) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	time.Sleep(2 * time.Second)
	return s.err
}

type msgLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *msgLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *msgLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *msgLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *msgLog) WithGroup(string) slog.Handler      { return l }

// A completion that outlives the answer grace (Ending.Pending: the caller has
// answered) and then fails for good (the lease lost, a refusal) is logged: the
// response was not stored, and nobody else will say so.
func TestPendingCompletionFailureLogged(t *testing.T) {
	for _, err := range []error{store.ErrLeaseLost, store.ErrInvalid, store.ErrCorrupt} {
		t.Run(err.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &msgLog{}
				cl, cerr := claim.New(claim.Config{Store: slowRefusal{notInProcess{memory.New()}, err}, Lease: 10 * time.Second,
					Retention: time.Hour, Logger: slog.New(logs)})
				if cerr != nil {
					t.Fatal(cerr)
				}
				id := store.ID{Key: "k"}
				res, sent, cerr := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
				if cerr != nil {
					t.Fatal(cerr)
				}
				var e claim.Execution
				end := e.Run(cl, t.Context(), claim.Claimed{Claim: claim.Claim{ID: id, Token: res.Token}, Sent: sent}, nil,
					func() claim.Outcome { return claim.Outcome{Response: store.Response{Status: 201}} })
				if !end.Pending {
					t.Fatalf("ending %+v; want Pending (the store answers after the grace)", end)
				}
				if err := cl.Wait(t.Context()); err != nil {
					t.Fatal(err)
				}
				logs.mu.Lock()
				defer logs.mu.Unlock()
				for _, m := range logs.msgs {
					if strings.Contains(m, "not stored") || strings.Contains(m, "refused") {
						return
					}
				}
				t.Fatalf("logs %q; want the lost completion logged", logs.msgs)
			})
		})
	}
}
