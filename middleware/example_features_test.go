package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// send posts body with key through h and prints the status, the replay mark and
// the problem code or body.
func send(h http.Handler, key, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A client that stamps each try with the time it was sent is still recognised:
// the fingerprint covers only the members that decide the payment.
func ExampleWithRequestFingerprint() {
	rule, err := fingerprint.OnlyJSONFields("/amountCents", "/to")
	if err != nil {
		panic(err)
	}
	m, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithRequestFingerprint(middleware.FingerprintRule{Body: rule}))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, body := range []string{
		`{"amountCents":500,"to":"acc-2","sentAt":"10:00:00"}`,
		`{"amountCents":500,"to":"acc-2","sentAt":"10:00:07"}`, // the retry: replayed
		`{"amountCents":900,"to":"acc-2","sentAt":"10:00:09"}`, // another amount: 422
		`amountCents=500`, // not JSON: 400
	} {
		w := send(h, "k-1", body)
		fmt.Printf("%d replayed=%q\n", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
	// 422 replayed=""
	// 400 replayed=""
}

// The replay carries this request's own request id, and only the stored
// headers of the allow list; the stored body is the first response's.
func ExampleWithReplay() {
	replays := 0
	m, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithReplay(middleware.ReplayRule{
		Headers: []string{"Location"},
		OnReplay: func(r *http.Request, h http.Header) {
			replays++
			h.Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		},
	}))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/payments/1")
		w.Header().Set("X-Debug", "not replayed")
		w.WriteHeader(http.StatusCreated)
	}))
	send(h, "k-1", "{}", "X-Request-Id", "req-1")
	w := send(h, "k-1", "{}", "X-Request-Id", "req-2")
	fmt.Printf("%d %s %s %q %d\n", w.Code, w.Header().Get("Location"), w.Header().Get("X-Request-Id"), w.Header().Get("X-Debug"), replays)
	// Output: 201 /payments/1 req-2 "" 1
}

// Keys must be UUIDs; anything else is refused before any work, with the
// validator's text as the problem's detail. The header and whether a key is
// required are the other fields of the rule.
func ExampleWithKey() {
	m, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithKey(policy.KeyRule{Validate: policy.UUIDKeys}))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	fmt.Println(send(h, "order-42", "{}").Code)
	fmt.Println(send(h, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "{}").Code)
	short := func(key string) error {
		if len(key) < 16 {
			return errors.New("an idempotency key has at least 16 characters")
		}
		return nil
	}
	m2, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithKey(policy.KeyRule{Validate: short}))
	w := send(m2.Handler(http.NotFoundHandler()), "abc", "{}")
	fmt.Println(w.Code, strings.Contains(w.Body.String(), `"detail":"an idempotency key has at least 16 characters"`))
	// Output:
	// 400
	// 201
	// 400 true
}

// Problems link to your own documentation, in their type and, for the draft's
// error scenarios, a Link field.
func ExampleWithProblems() {
	m, _ := middleware.New(memory.New(), middleware.GlobalScope,
		middleware.WithProblems(middleware.ProblemRule{TypeBase: "https://api.example.com/problems/"}))
	h := m.Handler(http.NotFoundHandler())
	r := httptest.NewRequest("POST", "/payments", strings.NewReader("{}")) // no key
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Link"))
	fmt.Println(strings.Contains(w.Body.String(), `"type":"https://api.example.com/problems/idempotency_key_missing"`))
	// Output:
	// 400 <https://api.example.com/problems/idempotency_key_missing>; rel="describedby"
	// true
}

// A failed validation is kept ten minutes, a payment thirty days: the handler
// decides (claim.SetRetention), within the middleware's maximum.
func ExampleWithRecordRetention() {
	m, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithRecordRetention(policy.RetentionRule{Max: 30 * 24 * time.Hour}))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Content-Type"), "json") {
			claim.SetRetention(r.Context(), 10*time.Minute)
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		claim.SetRetention(r.Context(), 30*24*time.Hour)
		c, _ := claim.FromContext(r.Context())
		fmt.Println("kept for", c.Retention)
		w.WriteHeader(http.StatusCreated)
	}))
	fmt.Println(send(h, "k-1", "{}").Code)
	fmt.Println(send(h, "k-2", "{}", "Content-Type", "application/json").Code)
	// Output:
	// 422
	// kept for 720h0m0s
	// 201
}

// A 404 of the application is the result of the request and is replayed; a
// 503 of a dependency releases the key, so the retry runs again. Here the
// release rule also keeps a 502 (the payment provider answered, badly), and the
// router's own 404 is stored like the application's.
func ExampleWithRelease() {
	status := http.StatusBadGateway
	m, _ := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithRelease(middleware.ReleaseRule{
		Status:        func(s int) bool { return s != http.StatusBadGateway && middleware.DefaultRelease(s) },
		StoreUnrouted: true,
	}))
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(status)
	}))
	send(h, "k-1", "{}")
	fmt.Println(send(h, "k-1", "{}").Code, runs) // 502 stored: replayed
	status = http.StatusServiceUnavailable
	send(h, "k-2", "{}")
	fmt.Println(send(h, "k-2", "{}").Code, runs) // 503 released: run again
	// Output:
	// 502 1
	// 503 3
}

// downStore is a store that cannot answer.
type downStore struct{ store.Store }

func (downStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, errors.New("connection refused")
}

// When the store cannot answer, the request is refused with 503 and a
// Retry-After (fail closed); with FailOpen the handler runs unprotected.
func ExampleWithStoreFailure() {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	quiet := middleware.WithLogger(slog.New(slog.DiscardHandler))
	closed, _ := middleware.New(downStore{memory.New()}, middleware.GlobalScope, quiet,
		middleware.WithStoreFailure(policy.StoreFailureRule{
			Timeouts:   claim.Timeouts{Claim: 2 * time.Second},
			RetryAfter: 5 * time.Second,
		}))
	w := send(closed.Handler(ok), "k-1", "{}")
	fmt.Println(w.Code, w.Header().Get("Retry-After"))
	open, _ := middleware.New(downStore{memory.New()}, middleware.GlobalScope, quiet,
		middleware.WithStoreFailure(policy.StoreFailureRule{FailOpen: true}))
	fmt.Println(send(open.Handler(ok), "k-1", "{}").Code)
	// Output:
	// 503 5
	// 201
}

// One policy.Config is the shared default of a service (the gRPC interceptor
// and idem take the same value); a route overrides one decision with a later
// option, which replaces that whole decision: here fail-open goes back to the
// default, fail closed.
func ExampleWithPolicy() {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	shared := policy.Config{
		Key:          policy.KeyRule{Validate: policy.UUIDKeys},
		StoreFailure: policy.StoreFailureRule{FailOpen: true, RetryAfter: 2 * time.Second},
	}
	quiet := middleware.WithLogger(slog.New(slog.DiscardHandler))
	payments, _ := middleware.New(downStore{memory.New()}, middleware.GlobalScope, quiet,
		middleware.WithPolicy(shared), middleware.WithStoreFailure(policy.StoreFailureRule{RetryAfter: 2 * time.Second}))
	w := send(payments.Handler(ok), "8e03978e-40d5-43e8-bc93-6894a57f9324", "{}")
	fmt.Println(w.Code, w.Header().Get("Retry-After"))
	fmt.Println(send(payments.Handler(ok), "not-a-uuid", "{}").Code)
	// Output:
	// 503 2
	// 400
}
