package celeriantsim_test

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// TestHostileClients: connections that declare a 16 MiB body and send a few bytes cost
// the simulator memory for what arrived, not for what was declared; a client trickling
// bytes cannot keep a request open past IdleTimeout; every connection goroutine ends.
func TestHostileClients(t *testing.T) {
	const conns = 32
	before := runtime.NumGoroutine()
	sim := celeriantsim.New(celeriantsim.Options{IdleTimeout: 300 * time.Millisecond})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const declared = celeriant.DefaultMaxRequestSize
	frame := wire.AppendHeader(nil, wire.Header{Version: 3, Type: wire.ReqWrite, CompressedLength: declared, UncompressedLength: declared})
	frame = append(frame, 0x94, 0xc0)

	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	var wg sync.WaitGroup
	errs := make(chan error, conns+1)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := nc.Write(frame); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadAll(nc); err != nil { // the simulator closes it at IdleTimeout
				errs <- err
			}
		}()
	}
	// Slow loris: one byte every 50 ms keeps arriving, but the request as a whole must
	// arrive within IdleTimeout.
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			errs <- err
			return
		}
		defer nc.Close()
		for _, b := range frame {
			if _, err := nc.Write([]byte{b}); err != nil {
				return // closed by the simulator
			}
			time.Sleep(50 * time.Millisecond)
		}
		// All 19 bytes went into the socket buffer: the close must still come.
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		var ne net.Error
		if _, err := io.ReadAll(nc); errors.As(err, &ne) && ne.Timeout() {
			errs <- errors.New("slow loris: connection kept open")
		}
	}()
	wg.Wait()
	runtime.ReadMemStats(&m1)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := m1.TotalAlloc - m0.TotalAlloc; n > 64<<20 {
		t.Fatalf("%d connections declaring %d bytes each made the simulator allocate %d bytes", conns, declared, n)
	}
	if err := sim.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}
