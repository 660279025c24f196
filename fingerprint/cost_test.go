package fingerprint

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkSumJSONBody measures the fingerprint of a typical JSON body of
// 128 B and 1 KiB, without a rule, with CanonicalJSON and under the two JSON
// rules: the cost a request pays before its claim.
func BenchmarkSumJSONBody(b *testing.B) {
	only, _ := OnlyJSONFields("/amountCents", "/currency", "/to")
	ignore, _ := IgnoreJSONFields("/sentAt")
	for _, size := range []int{128, 1024} {
		head := `{"amountCents":1234,"currency":"EUR","to":"acc-2","sentAt":"2026-12-01T10:00:00Z","note":"`
		body := []byte(head + strings.Repeat("n", size-len(head)-2) + `"}`)
		for _, c := range []struct {
			name string
			o    Options
		}{{"raw", Options{}}, {"canonical", Options{CanonicalJSON: true}}, {"only", Options{Rule: only}}, {"ignore", Options{Rule: ignore}}} {
			b.Run(fmt.Sprintf("%s/%dB", c.name, len(body)), func(b *testing.B) {
				req := Request{Method: "POST", Route: "/payments", Body: body}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Sum(req, c.o); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
