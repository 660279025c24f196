package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey/middleware"
	idemgin "github.com/idemkey/idemkey/middleware/gin"
	"github.com/idemkey/idemkey/store/memory"
)

// The middleware on a gin group: the retry is replayed, the handler runs once.
func Example() {
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		panic(err)
	}
	r := gin.New()
	charges := 0
	api := r.Group("/api", idemgin.Middleware(m))
	api.POST("/payments", func(c *gin.Context) {
		charges++
		id, _ := idemgin.KeyFromContext(c)
		c.String(http.StatusCreated, "charge %d for %s/%s", charges, id.Scope, id.Key)
	})
	for range 2 {
		req := httptest.NewRequest("POST", "/api/payments", strings.NewReader(`{"amountCents":500}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 201  charge 1 for anonymous/order-1
	// 201 true charge 1 for anonymous/order-1
}
