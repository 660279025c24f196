package idemechov5_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/idemkey/idemkey/middleware"
	idemechov5 "github.com/idemkey/idemkey/middleware/echov5"
	"github.com/idemkey/idemkey/store/memory"
)

// The middleware on an echo v5 group: the retry is replayed, the handler runs
// once.
func Example() {
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		panic(err)
	}
	e := echo.New()
	charges := 0
	api := e.Group("/api", idemechov5.Middleware(m))
	api.POST("/payments", func(c *echo.Context) error {
		charges++
		id, _ := idemechov5.KeyFromContext(c)
		return c.String(http.StatusCreated, fmt.Sprintf("charge %d for %s/%s", charges, id.Scope, id.Key))
	})
	for range 2 {
		r := httptest.NewRequest("POST", "/api/payments", strings.NewReader(`{"amountCents":500}`))
		r.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 201  charge 1 for anonymous/order-1
	// 201 true charge 1 for anonymous/order-1
}
