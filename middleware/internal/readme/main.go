// Command readme is the README's program, kept compiling.
package main

import (
	"fmt"
	"log"
	"net/http"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication: scope keys by your authenticated principal.
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err) // a misconfiguration fails here, never as a 400 later
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		id, _ := middleware.KeyFromContext(r.Context()) // scope and key, e.g. to derive an event ID
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %s charged once\n", id.Key)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8081", m.Handler(mux)))
}
