package idemprom_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// gather reads reg back as "name/label values" -> value: a counter's or gauge's
// value, a histogram's sample count.
func gather(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
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
			case mt.Gauge != nil:
				got[name] = mt.GetGauge().GetValue()
			case mt.Histogram != nil:
				got[name] = float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	return got
}

// show prints the series of reg whose names start with prefix, sorted, skipping
// zeros: for Examples.
func show(reg prometheus.Gatherer, prefix string) {
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	var lines []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), prefix) {
			continue
		}
		for _, mt := range f.GetMetric() {
			name := f.GetName()
			var labels []string
			for _, l := range mt.GetLabel() {
				labels = append(labels, l.GetName()+"="+fmt.Sprintf("%q", l.GetValue()))
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			var v float64
			switch {
			case mt.Counter != nil:
				v = mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				v = mt.GetGauge().GetValue()
			case mt.Histogram != nil:
				name += " count"
				v = float64(mt.GetHistogram().GetSampleCount())
			}
			if v != 0 {
				lines = append(lines, fmt.Sprintf("%s %v", name, v))
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
}
