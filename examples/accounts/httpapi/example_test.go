package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/accounts/httpapi"
)

// The handler over an account service; the KeyFunc here reads the header directly, where
// an application wires the idempotency middleware's context accessor instead
// (middleware.KeyFromContext).
func Example() {
	svc, _ := accounts.New(celeriantsim.New(celeriantsim.Options{}), accounts.NewMemoryProjection())
	_ = svc.Seed(context.Background())
	h := httpapi.New(svc, httpapi.WithKeyFunc(func(r *http.Request) (string, string, bool) {
		k := r.Header.Get("Idempotency-Key")
		return r.Header.Get("X-Client-ID"), k, k != ""
	}))

	for _, body := range []string{`{"amountCents":2500}`, `{"amountCents":2500}`, `{"amountCents":0}`} {
		req := httptest.NewRequest("POST", "/api/accounts/"+accounts.AliceID.String()+"/deposit", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Print(w.Code, " ", w.Body.String())
	}
	// Output:
	// 200 {"balanceCents":52500,"aggregateVersion":2}
	// 200 {"balanceCents":52500,"aggregateVersion":2}
	// 422 {"type":"urn:example:accounts:problem:validation_error","title":"Unprocessable Entity","status":422,"detail":"Field amountCents must be a positive integer of at most 2147483647 cents.","code":"validation_error","error":"VALIDATION_ERROR","message":"Field amountCents must be a positive integer of at most 2147483647 cents."}
}
