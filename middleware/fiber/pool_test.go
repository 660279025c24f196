package idemfiber_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/store/memory"
)

// TestReplayHookHeaderNotReused: the header map ReplayRule.OnReplay gets is
// never another request's afterwards. The adapter pools its writers with
// their header maps; a hook that keeps the map (an audit log written from a
// goroutine) would otherwise read, or write into, a later customer's
// response headers, and crash the process on a concurrent map access.
func TestReplayHookHeaderNotReused(t *testing.T) {
	var kept http.Header
	m, err := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithReplay(middleware.ReplayRule{
		OnReplay: func(r *http.Request, h http.Header) {
			h.Set("X-Audit", r.Header.Get("X-Account"))
			if kept == nil {
				kept = h
			}
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	app.Post("/pay", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		c.Set("X-Account", c.Get("X-Account"))
		return c.Status(http.StatusCreated).SendString("paid by " + c.Get("X-Account"))
	})
	h := serve(app)
	post := func(key, account string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay", nil)
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Account", account)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	post("alice-1", "alice")
	if w := post("alice-1", "alice"); w.Header().Get("X-Audit") != "alice" || kept == nil {
		t.Fatalf("replay: %d %v, hook ran: %v", w.Code, w.Header(), kept != nil)
	}
	for i := range 50 {
		if got := [2]string{kept.Get("X-Audit"), kept.Get("X-Account")}; got != [2]string{"alice", "alice"} {
			t.Fatalf("before bob's request %d the header alice's replay hook kept is %v", i, kept)
		}
		post(fmt.Sprint("bob-", i), "bob")
		post(fmt.Sprint("bob-", i), "bob")
	}
}
