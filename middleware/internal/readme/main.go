// Command readme is the README's net/http snippet, kept compiling.
package main

import (
	"encoding/json"
	"log"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	// X-Client-ID stands in for authentication; in production scope by the
	// authenticated principal (middleware.WithPrincipal, ScopeFromPrincipal).
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
		middleware.WithLease(10*time.Second), middleware.WithRetention(24*time.Hour))
	if err != nil {
		log.Fatal(err) // a misconfiguration fails here, never as a 400 later
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		id, _ := middleware.KeyFromContext(r.Context()) // scope and key, e.g. to derive an event ID
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"payment": id.Key})
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", m.Handler(mux)))
}
