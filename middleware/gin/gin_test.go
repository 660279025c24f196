package idemgin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey/middleware"
	idemgin "github.com/idemkey/idemkey/middleware/gin"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
	"github.com/idemkey/idemkey/store/memory"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode) // no debug route listing in the test output
	os.Exit(m.Run())
}

// newServer is the decision table's router on gin: the adapter on the /api
// group, errors answered with c.AbortWithStatusJSON, gin.Recovery outside.
func newServer(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard))
	g := r.Group("/api", idemgin.Middleware(m))
	g.POST("/pay/:id", func(c *gin.Context) {
		id, ok := idemgin.KeyFromContext(c)
		body, _ := io.ReadAll(c.Request.Body)
		run, v := a.Pay(c.Param("id"), id, ok, body)
		c.Header("X-Run", run)
		c.JSON(http.StatusCreated, v)
	})
	g.POST("/slow", func(c *gin.Context) { c.String(http.StatusOK, a.Slow()) })
	g.POST("/flaky", func(c *gin.Context) {
		if a.Flaky() {
			c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"message": "try later"})
			return
		}
		c.String(http.StatusOK, "fine")
	})
	g.POST("/panic", func(c *gin.Context) {
		a.Panic()
		c.String(http.StatusOK, "fine")
	})
	g.POST("/large", func(c *gin.Context) { c.String(http.StatusOK, a.Large()) })
	g.POST("/refuse", func(c *gin.Context) {
		a.Refuse()
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"message": "no"})
	})
	g.GET("/pay/:id", func(c *gin.Context) {
		_, ok := idemgin.KeyFromContext(c)
		c.String(http.StatusOK, a.Get(ok))
	})
	return r
}

// TestDecisionTable runs the shared decision table (the one the net/http
// middleware and the echo adapters run) through gin and the adapter.
func TestDecisionTable(t *testing.T) { decisiontest.Run(t, newServer) }

func send(h http.Handler, method, path, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader("{}"))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestChainSemantics: the middleware's own answers abort the chain; a status
// without a body is stored and replayed; a handler's c.Abort stops the chain
// inside; outer middleware sees gin's writer restored with what was sent.
func TestChainSemantics(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	r := gin.New()
	r.Use(func(c *gin.Context) { // outer: what the chain left in c
		w := c.Writer
		c.Next()
		trail = append(trail, fmt.Sprintf("outer sees own=%t status=%d size=%d aborted=%t", c.Writer == w, c.Writer.Status(), c.Writer.Size(), c.IsAborted()))
	})
	r.Use(idemgin.Middleware(m))
	r.POST("/accept", func(c *gin.Context) {
		trail = append(trail, "accept")
		c.Status(http.StatusAccepted) // no body: sent when the chain returns (gin sends it last: size -1 until then)
	}, func(c *gin.Context) { trail = append(trail, "after accept") })
	r.POST("/stop", func(c *gin.Context) {
		trail = append(trail, "stop")
		c.AbortWithStatus(http.StatusForbidden)
	}, func(c *gin.Context) { trail = append(trail, "never") })

	var got []string
	for _, tc := range []struct{ path, key string }{
		{"/accept", "a"}, {"/accept", "a"}, // run, then replayed (the chain after the middleware is skipped)
		{"/accept", ""}, // 400 from the middleware: aborted
		{"/stop", "s"}, {"/stop", "s"},
	} {
		trail = trail[:0]
		w := send(r, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %q: %d replayed=%q %s", tc.path, tc.key, w.Code, w.Header().Get("Idempotent-Replayed"), strings.Join(trail, ", ")))
	}
	want := []string{
		`/accept "a": 202 replayed="" accept, after accept, outer sees own=true status=202 size=-1 aborted=false`,
		`/accept "a": 202 replayed="true" outer sees own=true status=202 size=-1 aborted=true`,
		`/accept "": 400 replayed="" outer sees own=true status=400 size=` + fmt.Sprint(len(send(r, "POST", "/accept", "").Body.String())) + ` aborted=true`,
		`/stop "s": 403 replayed="" stop, outer sees own=true status=403 size=-1 aborted=true`,
		`/stop "s": 403 replayed="true" outer sees own=true status=403 size=-1 aborted=true`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestNoRouteReleasesKey: gin's own 404 and 405, answered through a global
// middleware, release the key; the corrected request with the same key runs.
// A handler's own 404 is the application's answer and is replayed.
func TestNoRouteReleasesKey(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(idemgin.Middleware(m))
	runs := 0
	r.POST("/pay", func(c *gin.Context) { runs++; c.String(http.StatusCreated, "paid") })
	r.GET("/only-get", func(c *gin.Context) { c.String(http.StatusOK, "got") })
	r.POST("/missing", func(c *gin.Context) { runs++; c.String(http.StatusNotFound, "no such account") })
	var got []string
	for _, tc := range []struct{ path, key string }{
		{"/pya", "k1"}, {"/pay", "k1"}, // typo: 404 from gin, then the corrected path runs
		{"/only-get", "k2"}, {"/pay", "k2"}, // 405 from gin, then the corrected method runs
		{"/missing", "k3"}, {"/missing", "k3"}, // the handler's own 404: stored, replayed
	} {
		w := send(r, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %d %q %q", tc.path, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body))
	}
	want := `[/pya 404 "" "404 page not found" /pay 201 "" "paid" /only-get 405 "" "405 method not allowed" /pay 201 "" "paid" ` +
		`/missing 404 "" "no such account" /missing 404 "true" "no such account"]`
	if fmt.Sprint(got) != want || runs != 3 {
		t.Errorf("got %v, runs %d\nwant %s, runs 3", got, runs, want)
	}
}
