// Command readme is the Fiber snippet of docs/adapters.md, kept compiling.
package main

import (
	"log"
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication; in production scope by the
	// authenticated principal (middleware.ContextWithPrincipal, ScopeFromPrincipal).
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	app := fiber.New()
	app.Use(recover.New()) // outside: a panic releases the claim, then answers 500
	api := app.Group("/api", idemfiber.Middleware(m))
	api.Post("/payments", func(c *fiber.Ctx) error {
		id, _ := idemfiber.KeyFromContext(c)
		if id.Key == "declined" {
			// A returned error is rendered inside the middleware: stored and replayed.
			return fiber.NewError(http.StatusUnprocessableEntity, "card declined")
		}
		return c.Status(http.StatusCreated).JSON(fiber.Map{"payment": id.Key})
	})
	log.Fatal(app.Listen("127.0.0.1:8080"))
}
