package client_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkey/idemkey/client"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// A payment API behind the middleware answers the first attempt 503; the
// client retries with the same key and the same body, and the second attempt
// is the one that charges.
func Example() {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		panic(err)
	}
	attempts, keys := 0, map[string]bool{}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts++
		keys[r.Header.Get("Idempotency-Key")] = true
		if attempts == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // released: the retry runs again
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charged %s", body)
	})))
	defer srv.Close()

	tr, err := client.New(client.WithBackoff(10*time.Millisecond, time.Second))
	if err != nil {
		panic(err)
	}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amountCents":500}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", attempts, "keys:", len(keys))
	// Output:
	// 201 charged {"amountCents":500}
	// attempts: 2 keys: 1
}
