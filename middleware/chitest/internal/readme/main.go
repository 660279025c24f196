// Command readme is the chi snippet of docs/adapters.md, kept compiling.
package main

import (
	"encoding/json"
	"log"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication; in production scope by the
	// authenticated principal (middleware.ContextWithPrincipal, ScopeFromPrincipal).
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(m.Handler) // no adapter: chi handlers write to the http.ResponseWriter
		r.Post("/accounts/{id}/deposit", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(map[string]string{"account": chi.URLParam(r, "id")})
		})
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", r))
}
