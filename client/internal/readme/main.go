// Command readme is the client snippet of docs/adapters.md, kept compiling.
package main

import (
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/idemkey/idemkey/client"
)

func main() {
	tr, err := client.New(client.WithMaxAttempts(4), client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c := &http.Client{Transport: tr, Timeout: time.Minute} // Timeout bounds all attempts together
	resp, err := c.Post("http://127.0.0.1:8080/payments", "application/json",
		strings.NewReader(`{"amountCents":500}`))
	if err != nil {
		log.Fatal(err) // every attempt failed; to retry later, set Idempotency-Key yourself and keep it
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status, "key", resp.Request.Header.Get("Idempotency-Key"))
}
