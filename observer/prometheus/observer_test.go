package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	idemprom "github.com/idemkey/idemkey/observer/prometheus"
	"github.com/idemkey/idemkey/store"
)

// TestObserver feeds events to the observer and reads the registry back.
func TestObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := idemprom.NewObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []middleware.Event{
		{Decision: middleware.Executed, StoreLatency: 2 * time.Millisecond},
		{Decision: middleware.Executed, StoreLatency: time.Millisecond, Takeover: true, InTransaction: true},
		{Decision: middleware.Replayed, StoreLatency: time.Millisecond, Waited: 30 * time.Millisecond},
		{Decision: middleware.InFlight, StoreLatency: time.Millisecond, Waited: time.Second},
		{Decision: middleware.Mismatch, StoreLatency: time.Millisecond},
		{Decision: middleware.StoreError, Err: errors.New("down")},
		{Decision: middleware.Executed, Err: errors.New("complete failed"), CompletionPending: true},
		{Decision: middleware.LeaseLost, Err: store.ErrLeaseLost},                            // not a store failure
		{Decision: middleware.StoreFull, Err: store.ErrFull, StoreLatency: time.Microsecond}, // nor is this
		{Decision: middleware.ClientGone, Err: context.Canceled},                             // nor is a client's hang-up
		{Decision: middleware.PassThrough},
		{Decision: middleware.KeyMissing},
		{Decision: middleware.Decision(200)}, // a decision this build does not know
	} {
		m.Observe(ctx, e)
	}
	if _, err := idemprom.NewObserver(reg); err == nil {
		t.Error("registering twice succeeded")
	}
	got := gather(t, reg)
	for name, want := range map[string]float64{
		"idemkey_decisions_total/executed":         3,
		"idemkey_decisions_total/replayed":         1,
		"idemkey_decisions_total/pass_through":     1,
		"idemkey_decisions_total/key_missing":      1,
		"idemkey_decisions_total/fail_open":        0,
		"idemkey_decisions_total/store_full":       1,
		"idemkey_store_latency_seconds/store_full": 1,
		"idemkey_decisions_total/client_gone":      1,
		"idemkey_decisions_total/unknown":          1,
		"idemkey_store_latency_seconds/executed":   3,
		"idemkey_store_latency_seconds/replayed":   1,
		"idemkey_replays_total":                    1,
		"idemkey_in_flight_total":                  1,
		"idemkey_mismatches_total":                 1,
		"idemkey_store_errors_total":               2,
		"idemkey_takeovers_total":                  1,
		"idemkey_in_transaction_completions_total": 1,
		"idemkey_completions_pending_total":        1,
		"idemkey_wait_seconds":                     2,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == "idemkey_wait_seconds" {
			b := f.GetMetric()[0].GetHistogram().GetBucket()
			if len(b) != len(idemprom.DefaultWaitBuckets) || b[len(b)-1].GetUpperBound() != 30 || b[len(b)-1].GetCumulativeCount() != 2 {
				t.Errorf("wait buckets %v: want DefaultWaitBuckets, up to 30 s, the 1 s wait inside", b)
			}
		}
	}
	for _, name := range []string{"idemkey_store_latency_seconds/pass_through", "idemkey_store_latency_seconds/key_missing"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s: a request that never reached the store observed store latency", name)
		}
	}
}

// TestObserverHandlerAnswers: the handler's own answers are counted by status;
// replays and the middleware's own refusals are not handler answers.
func TestObserverHandlerAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := idemprom.NewObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []middleware.Event{
		{Decision: middleware.Released, Status: 409},
		{Decision: middleware.Released, Status: 409},
		{Decision: middleware.Executed, Status: 422},
		{Decision: middleware.Executed, Status: 200},
		{Decision: middleware.Released, Status: 503},
		{Decision: middleware.FailOpen, Status: 201},
		{Decision: middleware.LeaseLost, Status: 202},
		{Decision: middleware.Executed, Status: 0}, // hijacked: no status
		{Decision: middleware.Replayed, Status: 422},
		{Decision: middleware.InFlight, Status: 409},
		{Decision: middleware.Mismatch, Status: 422},
	} {
		m.Observe(context.Background(), e)
	}
	got := map[string]float64{}
	for name, v := range gather(t, reg) {
		if s, ok := strings.CutPrefix(name, "idemkey_handler_answers_total/"); ok {
			got[s] = v
		}
	}
	if want := map[string]float64{"409": 2, "422": 1, "200": 1, "503": 1, "201": 1, "202": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("handler answers %v, want %v", got, want)
	}
}

// TestObserverNilRegisterer: a nil registry is an error at construction, not a
// panic.
func TestObserverNilRegisterer(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("NewObserver(nil) panicked: %v", r)
		}
	}()
	if m, err := idemprom.NewObserver(nil); err == nil || m != nil {
		t.Fatalf("NewObserver(nil) = %v, %v; want an error", m, err)
	}
}

// TestObserverBadBuckets: buckets client_golang would panic on fail at
// construction with an error; good ones are used.
func TestObserverBadBuckets(t *testing.T) {
	for _, tc := range []struct {
		buckets []float64
		ok      bool
	}{
		{nil, false},
		{[]float64{1, 0.5}, false},
		{[]float64{1, 1}, false},
		{[]float64{0.1, math.NaN()}, false},
		{[]float64{0.5, 1}, true},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%v: NewObserver panicked: %v", tc.buckets, r)
				}
			}()
			reg := prometheus.NewRegistry()
			m, err := idemprom.NewObserver(reg, idemprom.WithLatencyBuckets(tc.buckets))
			if (err == nil) != tc.ok {
				t.Errorf("%v: NewObserver error %v, want ok %v", tc.buckets, err, tc.ok)
			}
			if _, err := idemprom.NewObserver(prometheus.NewRegistry(), idemprom.WithWaitBuckets(tc.buckets)); (err == nil) != tc.ok {
				t.Errorf("%v as wait buckets: NewObserver error %v, want ok %v", tc.buckets, err, tc.ok)
			}
			if err != nil {
				return
			}
			m.Observe(context.Background(), middleware.Event{Decision: middleware.Executed, StoreLatency: 700 * time.Millisecond})
			families, _ := reg.Gather()
			for _, f := range families {
				if f.GetName() == "idemkey_store_latency_seconds" {
					if b := f.GetMetric()[0].GetHistogram().GetBucket(); len(b) != 2 || b[0].GetCumulativeCount() != 0 || b[1].GetCumulativeCount() != 1 {
						t.Errorf("buckets %v", b)
					}
				}
			}
		}()
	}
}
