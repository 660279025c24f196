package celeriantsim_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// FuzzServer sends arbitrary bytes to the simulator's TCP server as one client
// connection: the server must answer with well-formed frames or close the connection,
// never panic (a panic in a connection goroutine kills the process) or hang.
func FuzzServer(f *testing.F) {
	enc := wire.NewEncoder()
	k := celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
	w := celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
		Key: k, Events: []celeriant.Event{evt(1)}, AllowCreate: true, ExpectedVersion: celeriant.Version(0), EnforceClientIdempotency: true,
	}}}
	write := bytes.Clone(enc.WriteRequest(&w))
	read := bytes.Clone(enc.ReadRequest(&celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 1, MinClientSeq: celeriant.Uint64(1)}}))
	details := bytes.Clone(enc.AggregateDetailsRequest(uuid.Nil, k))
	f.Add(write)
	f.Add(append(append(bytes.Clone(write), read...), details...))
	f.Add(append(bytes.Clone(read), write...))
	f.Add(details[:20])

	sim := celeriantsim.New(celeriantsim.Options{IdleTimeout: time.Second, MaxRequestSize: 1 << 16, PageBatches: 2})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sim.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write(data); err != nil {
			return // the server closed early
		}
		_ = nc.(*net.TCPConn).CloseWrite()
		answer, err := io.ReadAll(nc)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("connection neither answered nor closed")
		}
		if err != nil {
			return // reset: the server closed with input unread, answers may be cut
		}
		r := bytes.NewReader(answer)
		for r.Len() > 0 {
			if _, _, err := wire.ReadFrame(r, nil, func(h wire.Header) error { return h.CheckResponse(1 << 20) }); err != nil {
				t.Fatalf("malformed answer frame: %v", err)
			}
		}
	})
}
