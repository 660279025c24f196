package webui_test

import (
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/idemkey/idemkey/examples/accounts/webui"
)

// The page is one self-contained document: no external script, style or image;
// it calls the API and the watch stream on its own origin.
func Example() {
	h := webui.Handler()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	body := w.Body.String()
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	fmt.Println(strings.Contains(body, "new EventSource('/api/watch/stream')"), strings.Contains(body, "'Idempotency-Key': key"))
	fmt.Println(strings.Contains(body, "src=") || strings.Contains(body, "href="))

	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/", nil))
	fmt.Println(w.Code, w.Header().Get("Allow"))
	// Output:
	// 200 text/html; charset=utf-8
	// true true
	// false
	// 405 GET, HEAD
}
