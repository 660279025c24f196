package watchfeed_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts/watchfeed"
)

// BenchmarkStream: b.N writes, round robin over 40 watched accounts, from one
// goroutine, while one browser reads the SSE stream; reports the data events it
// received per second and per write (below 1 when pending updates of one account
// were coalesced). In-process simulator, and the TCP client in front of it.
func BenchmarkStream(b *testing.B) {
	for _, tcp := range []bool{false, true} {
		name := "in-process"
		if tcp {
			name = "tcp"
		}
		b.Run(name, func(b *testing.B) {
			sim := celeriantsim.New(celeriantsim.Options{})
			b.Cleanup(func() { _ = sim.Close() }) // last: after the feed stopped
			var w celeriant.Watcher = sim
			if tcp {
				ln, err := sim.ListenAndServe("127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				c, err := celeriant.New(celeriant.Config{Addrs: []string{ln.Addr().String()}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = c.Close() })
				w = c
			}
			ids := make([]uuid.UUID, 40)
			for i := range ids {
				ids[i] = uuid.New()
			}
			f, err := watchfeed.New(w, watchfeed.Options{Org: org, Type: typ, Accounts: ids, Heartbeat: 20 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			f.Start(context.Background())
			b.Cleanup(f.Close)
			<-f.Ready()
			srv := httptest.NewServer(f)
			b.Cleanup(srv.Close) // after the connection's cleanup (connect): Close waits for it
			s := connect(b, srv.URL)
			s.next()

			client := uuid.New()
			finals := make(chan []uint64, 1)
			got := make(chan int)
			b.ResetTimer()
			start := time.Now()
			go func() { // count data events until every account's last version arrived
				n, seen := 0, make(map[uuid.UUID]uint64)
				var want []uint64
				for {
					if want == nil {
						select {
						case want = <-finals:
						default:
						}
					}
					if want != nil && done(seen, ids, want) {
						got <- n
						return
					}
					lines := s.next() // a heartbeat at least every 20 ms
					if len(lines) != 1 || !strings.HasPrefix(lines[0], "data: ") {
						continue
					}
					var p payload
					_ = json.Unmarshal([]byte(strings.TrimPrefix(lines[0], "data: ")), &p)
					n++
					seen[p.AggregateID] = max(seen[p.AggregateID], p.ToAggregateVersion)
				}
			}()
			last := make([]uint64, len(ids))
			for i := range b.N {
				a := i % len(ids)
				res, err := sim.Write(context.Background(), celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{{
					Key: key(ids[a]), Events: []celeriant.Event{{ClientSeq: uint64(i + 1), TypeMajor: 1, Value: []byte("x")}}, AllowCreate: true,
				}}})
				if err != nil {
					b.Fatal(err)
				}
				last[a] = res.Version
			}
			finals <- last
			n := <-got
			el := time.Since(start)
			b.ReportMetric(float64(n)/el.Seconds(), "events/s")
			b.ReportMetric(float64(n)/float64(b.N), "events/write")
		})
	}
}

func done(seen map[uuid.UUID]uint64, ids []uuid.UUID, want []uint64) bool {
	for i, id := range ids {
		if seen[id] < want[i] {
			return false
		}
	}
	return true
}
