package main

import (
	_ "embed"
	"net/http"
)

// page is the checkout page: one HTML file with its style and script inline, so
// it needs nothing from the network.
//
//go:embed page.html
var page []byte

// servePage serves GET /, the checkout page.
func servePage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(page)
}
