package encrypted_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// The benchmarks compare the memory store alone ("plain") with the same store
// behind the wrapper ("sealed"), so the difference is the wrapper's cost: per
// first execution (Claim, then Complete of a new key) and per replay (Claim
// of a completed key), for a 128-byte and a 1 KiB body with two headers.
func benchStores(b *testing.B) map[string]store.Store {
	return map[string]store.Store{"plain": memory.New(), "sealed": wrap(b, memory.New(), newKey(b, "k1"))}
}

func BenchmarkExecute(b *testing.B) {
	for _, size := range []int{128, 1024} {
		for _, name := range []string{"plain", "sealed"} {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				st, resp := benchStores(b)[name], secretResponse(size)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					id := store.ID{Scope: "tenant", Key: "k" + strconv.Itoa(i)}
					res, err := st.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
					if err != nil || res.Outcome != store.Claimed {
						b.Fatal(res.Outcome, err)
					}
					if err := st.Complete(ctx, id, res.Token, resp, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	for _, size := range []int{128, 1024} {
		for _, name := range []string{"plain", "sealed"} {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				st, id := benchStores(b)[name], store.ID{Scope: "tenant", Key: "replayed"}
				res, err := st.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				if err := st.Complete(ctx, id, res.Token, secretResponse(size), time.Hour); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					res, err := st.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
					if err != nil || res.Outcome != store.Completed || len(res.Record.Body) != size {
						b.Fatal(res.Outcome, err)
					}
				}
			})
		}
	}
}
