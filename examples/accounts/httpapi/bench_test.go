package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
)

// BenchmarkDepositReplay measures the handler's own cost on the cheapest service path (a
// keyed deposit answered by the memory index): decode, EventId, encode.
func BenchmarkDepositReplay(b *testing.B) {
	svc, err := accounts.New(celeriantsim.New(celeriantsim.Options{}), accounts.NewMemoryProjection())
	if err != nil {
		b.Fatal(err)
	}
	h := New(svc, quiet, WithKeyFunc(func(*http.Request) (string, string, bool) { return "tenant", "key-1", true }))
	path := "/api/accounts/" + accounts.AliceID.String() + "/deposit"
	run := func() int {
		req := httptest.NewRequest("POST", path, strings.NewReader(`{"amountCents":100}`))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	if run() != 200 {
		b.Fatal("setup deposit failed")
	}
	b.Run("http", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if run() != 200 {
				b.Fatal("status")
			}
		}
	})
	b.Run("service", func(b *testing.B) {
		eventID := accounts.EventIDFor("tenant", "key-1", accounts.Operation("deposit", 100, accounts.AliceID))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := svc.Deposit(context.Background(), accounts.AliceID, 100, eventID); err != nil {
				b.Fatal(err)
			}
		}
	})
}
