package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// signallingStore tells the example when the retry starts waiting.
type signallingStore struct {
	*memory.Store
	waiting chan struct{}
}

func (s signallingStore) Wait(ctx context.Context, id store.ID) error {
	s.waiting <- struct{}{}
	return s.Store.Wait(ctx, id)
}

// A retry that races the original waits for its answer instead of a 409: the
// store wakes it when the original completes, and it gets the replay.
func ExampleWithWaitInFlight() {
	st := signallingStore{Store: memory.New(), waiting: make(chan struct{}, 1)}
	m, err := middleware.New(st, middleware.GlobalScope, middleware.WithWaitInFlight(5*time.Second))
	if err != nil {
		panic(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-finish // the original is slow
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"charge":1}`)
	}))
	send := func() <-chan *httptest.ResponseRecorder {
		out := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amountCents":500}`))
			r.Header.Set("Idempotency-Key", `"order-1"`)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			out <- w
		}()
		return out
	}
	original := send()
	<-started // the original holds the key
	retry := send()
	<-st.waiting // the retry found the key in flight and waits
	close(finish)
	for _, w := range []*httptest.ResponseRecorder{<-original, <-retry} {
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 201  {"charge":1}
	// 201 true {"charge":1}
}
