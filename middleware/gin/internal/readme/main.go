// Command readme is the gin snippet of docs/adapters.md, kept compiling.
package main

import (
	"log"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey/middleware"
	idemgin "github.com/idemkey/idemkey/middleware/gin"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication; in production scope by the
	// authenticated principal (middleware.ContextWithPrincipal, ScopeFromPrincipal).
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.Use(gin.Recovery()) // outside: a panic releases the claim, then answers 500
	api := r.Group("/api", idemgin.Middleware(m))
	api.POST("/payments", func(c *gin.Context) {
		id, _ := idemgin.KeyFromContext(c)
		if id.Key == "declined" {
			// Written through c.Writer inside the middleware: stored and replayed.
			c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"error": "card declined"})
			return
		}
		c.JSON(http.StatusCreated, gin.H{"payment": id.Key})
	})
	log.Fatal(r.Run("127.0.0.1:8080"))
}
