package idemfiber_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/store/memory"
)

// The middleware on a Fiber group: the retry is replayed, the handler runs once.
func Example() {
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		panic(err)
	}
	app := fiber.New()
	charges := 0
	api := app.Group("/api", idemfiber.Middleware(m))
	api.Post("/payments", func(c *fiber.Ctx) error {
		charges++
		id, _ := idemfiber.KeyFromContext(c)
		return c.Status(http.StatusCreated).SendString(fmt.Sprintf("charge %d for %s/%s", charges, id.Scope, id.Key))
	})
	for range 2 {
		r := httptest.NewRequest("POST", "/api/payments", strings.NewReader(`{"amountCents":500}`))
		r.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := app.Test(r) // through fasthttp's server, as in production
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	// Output:
	// 201  charge 1 for anonymous/order-1
	// 201 true charge 1 for anonymous/order-1
}
