// Command readme is the echo v4 snippet of docs/adapters.md, kept compiling.
package main

import (
	"log"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/middleware"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication; in production scope by the
	// authenticated principal (middleware.ContextWithPrincipal, ScopeFromPrincipal).
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	api := e.Group("/api", idemecho.Middleware(m))
	api.POST("/payments", func(c echo.Context) error {
		id, _ := idemecho.KeyFromContext(c)
		if id.Key == "declined" {
			// Rendered inside the middleware: this 422 is stored and replayed.
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "card declined")
		}
		return c.JSON(http.StatusCreated, map[string]string{"payment": id.Key})
	})
	log.Fatal(e.Start("127.0.0.1:8080"))
}
