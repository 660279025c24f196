package accountsapp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// TestMetrics feeds events to the observer and reads the registry back.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []middleware.Event{
		{Decision: middleware.Executed, StoreLatency: 2 * time.Millisecond},
		{Decision: middleware.Executed, StoreLatency: time.Millisecond, Takeover: true},
		{Decision: middleware.Replayed, StoreLatency: time.Millisecond},
		{Decision: middleware.InFlight, StoreLatency: time.Millisecond},
		{Decision: middleware.Mismatch, StoreLatency: time.Millisecond},
		{Decision: middleware.StoreError, Err: errors.New("down")},
		{Decision: middleware.Executed, Err: errors.New("complete failed")},
		{Decision: middleware.LeaseLost, Err: store.ErrLeaseLost}, // not a store failure
		{Decision: middleware.PassThrough},
		{Decision: middleware.KeyMissing},
	} {
		m.Observe(ctx, e)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering twice succeeded")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			name := f.GetName()
			for _, l := range mt.GetLabel() {
				name += "/" + l.GetValue()
			}
			switch {
			case mt.Counter != nil:
				got[name] = mt.GetCounter().GetValue()
			case mt.Histogram != nil:
				got[name] = float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"idemkey_decisions_total/executed":       3,
		"idemkey_decisions_total/replayed":       1,
		"idemkey_decisions_total/pass_through":   1,
		"idemkey_decisions_total/key_missing":    1,
		"idemkey_decisions_total/fail_open":      0,
		"idemkey_store_latency_seconds/executed": 3,
		"idemkey_store_latency_seconds/replayed": 1,
		"idemkey_replays_total":                  1,
		"idemkey_in_flight_total":                1,
		"idemkey_mismatches_total":               1,
		"idemkey_store_errors_total":             2,
		"idemkey_takeovers_total":                1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	if _, ok := got["idemkey_store_latency_seconds/pass_through"]; ok {
		t.Error("a pass-through request observed store latency")
	}
}

// TestMetricsHandlerAnswers: the handler's own 409s and 422s (the write loop giving
// up, business refusals) are counted by status; replays and the middleware's own
// refusals are not handler answers.
func TestMetricsHandlerAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []middleware.Event{
		{Decision: middleware.Released, Status: 409},
		{Decision: middleware.Released, Status: 409},
		{Decision: middleware.Executed, Status: 422},
		{Decision: middleware.Executed, Status: 200},
		{Decision: middleware.Released, Status: 503},
		{Decision: middleware.Replayed, Status: 422},
		{Decision: middleware.InFlight, Status: 409},
		{Decision: middleware.Mismatch, Status: 422},
	} {
		m.Observe(context.Background(), e)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "idemkey_handler_answers_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
		}
	}
	if want := map[string]float64{"409": 2, "422": 1, "200": 1, "503": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("handler answers %v, want %v", got, want)
	}
}
