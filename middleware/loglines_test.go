package middleware

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// A completion refused for a lost lease is logged without naming a cause the
// middleware did not see: whether the key was evicted, released, or taken
// over, the line says the token no longer holds it, never that another request
// took it over.
func TestLeaseLostLogNamesNoUnseenCause(t *testing.T) {
	for name, lose := range map[string]func(*memory.Store, claim.Claim) error{
		"evicted": func(mem *memory.Store, cl claim.Claim) error {
			_, _, err := mem.Evict(context.Background(), cl.ID, store.EvictAny)
			return err
		},
		"released": func(mem *memory.Store, cl claim.Claim) error {
			return mem.Release(context.Background(), cl.ID, cl.Token)
		},
	} {
		t.Run(name, func(t *testing.T) {
			logs := &logRecorder{}
			mem := memory.New()
			var lostErr error
			m, err := New(mem, GlobalScope, WithLogger(slog.New(logs)))
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				cl, _ := claim.FromContext(r.Context())
				lostErr = lose(mem, cl)
				w.WriteHeader(http.StatusCreated)
			}))
			h.ServeHTTP(httptest.NewRecorder(), req("POST", "/p", "k", "x"))
			if lostErr != nil {
				t.Fatal(lostErr)
			}
			n, r := logs.count(slog.LevelWarn)
			if n == 0 {
				t.Fatal("no warning for a response not stored")
			}
			if strings.Contains(r.Message, "took the key over") || !strings.Contains(r.Message, "not stored") {
				t.Fatalf("log line %q", r.Message)
			}
		})
	}
}
