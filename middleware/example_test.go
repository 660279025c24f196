package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store/memory"
)

// The middleware in front of a payment handler, with the in-memory store. The
// retry of a request gets the original answer, marked as a replay; the handler
// runs once. The handler reads the scope and key (to derive an event ID, say).
func Example() {
	charges := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := middleware.KeyFromContext(r.Context())
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d,"scope":%q,"key":%q}`, charges, id.Scope, id.Key)
	})

	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Handler(pay))

	send := func(key, body string) {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Client-ID", "alice")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		b, _ := io.ReadAll(w.Body)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
	}
	send(`"order-1"`, `{"amountCents":500}`) // first execution
	send(`"order-1"`, `{"amountCents":500}`) // retry: replayed
	send(`"order-1"`, `{"amountCents":900}`) // same key, other payload: 422
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"charge":1,"scope":"alice","key":"order-1"}
	// 201 true {"charge":1,"scope":"alice","key":"order-1"}
	// 422  {"type":"urn:idemkey:problem:key_reused_with_different_payload","title":"Idempotency key reused","status":422,"detail":"This idempotency key was already used for a different request (method, route, query or body); use a new key.","code":"key_reused_with_different_payload"}
	// charges: 1
}

// A router that is not an *http.ServeMux marks its own not-found answer with
// Unrouted, so a request sent to the wrong path does not spend its key: the
// corrected request with the same key runs. (A ServeMux handed to Handler
// directly needs no wrapping.)
func ExampleUnrouted() {
	notFound := middleware.Unrouted(http.NotFoundHandler())
	router := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/payments" {
			notFound.ServeHTTP(w, r)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		panic(err)
	}
	h := m.Handler(router)
	for _, path := range []string{"/paymnets", "/payments", "/payments"} {
		r := httptest.NewRequest("POST", path, strings.NewReader(`{"amountCents":500}`))
		r.Header.Set("Idempotency-Key", `"order-2"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(path, w.Code, w.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// /paymnets 404 false
	// /payments 201 false
	// /payments 201 true
}

// Clients that read other members than code and detail get them on every
// problem the middleware answers: here the "error" and "message" members of the
// Celeriant reference's page.
func ExampleWithProblems_members() {
	m, err := middleware.New(memory.New(), middleware.GlobalScope,
		middleware.WithProblems(middleware.ProblemRule{Members: func(code, detail string) map[string]any {
			return map[string]any{"error": strings.ToUpper(code), "message": detail}
		}}))
	if err != nil {
		panic(err)
	}
	w := httptest.NewRecorder()
	m.Handler(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("POST", "/payments", strings.NewReader("{}")))
	fmt.Print(w.Code, " ", w.Body)
	// Output:
	// 400 {"type":"urn:idemkey:problem:idempotency_key_missing","title":"Idempotency-Key header missing","status":400,"detail":"This operation requires an Idempotency-Key header; send one and retry.","code":"idempotency_key_missing","error":"IDEMPOTENCY_KEY_MISSING","message":"This operation requires an Idempotency-Key header; send one and retry."}
}

// Only the methods named are protected: here PUT too, besides POST and PATCH.
// A GET passes through, its key ignored.
func ExampleWithMethods() {
	runs := 0
	m, err := middleware.New(memory.New(), middleware.GlobalScope,
		middleware.WithMethods(http.MethodPost, http.MethodPatch, http.MethodPut))
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++ }))
	for _, method := range []string{"PUT", "PUT", "GET", "GET"} {
		r := httptest.NewRequest(method, "/accounts/1", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", `"k-1"`)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	fmt.Println("runs:", runs)
	// Output: runs: 3
}

// Options apply to every request a Middleware wraps. A route that needs other
// decisions gets a Middleware of its own, built from the shared options followed
// by its own (a later option replaces that whole decision), wrapping only that
// route's handler. Wrap each route, not the mux as well: a request under two
// Middlewares over one store would be claimed twice and answered 409.
func ExampleMiddleware_Handler_perRoute() {
	scope := middleware.ScopeFromHeader("X-Client-ID", "anonymous")
	st := memory.New()
	shared := []middleware.Option{middleware.WithPolicy(policy.Config{Lease: 30 * time.Second})}
	payments, err := middleware.New(st, scope, shared...)
	if err != nil {
		panic(err)
	}
	// Refund records are kept a week: the shared options, then the route's own.
	refunds, err := middleware.New(st, scope, slices.Concat(shared, []middleware.Option{
		middleware.WithRecordRetention(policy.RetentionRule{Default: 7 * 24 * time.Hour}),
	})...)
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux := http.NewServeMux()
	mux.Handle("POST /payments", payments.Handler(ok))
	mux.Handle("POST /refunds", refunds.Handler(ok))

	for _, path := range []string{"/payments", "/refunds", "/refunds"} {
		r := httptest.NewRequest("POST", path, strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", `"k-`+path+`"`)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(path, w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// /payments 201 replayed: false
	// /refunds 201 replayed: false
	// /refunds 201 replayed: true
}
