package celeriant_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// allocated returns the bytes fn allocates (all goroutines; the tests here do not run
// in parallel).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestSkipDeepNesting: an unknown trailing field nested 16 million arrays deep is an
// error, not a stack overflow (a fatal error that kills the process, which the msgpack
// package's recursive Skip hits around 9 million levels).
func TestSkipDeepNesting(t *testing.T) {
	const depth = 16 << 20
	body := append([]byte{0x94, 0xc0, 0x90, 0xc0}, bytes.Repeat([]byte{0x91}, depth)...)
	if _, err := wire.NewDecoder().ReadResponse(body); !errors.Is(err, celeriant.ErrProtocol) {
		t.Fatalf("truncated nesting: %v", err)
	}
	body = append(body, 0xc0)
	res, err := wire.NewDecoder().ReadResponse(body)
	if err != nil || len(res.Batches) != 0 {
		t.Fatalf("complete nesting is a valid unknown field: %+v %v", res, err)
	}
}

// TestSkipValues: the iterative skip steps over every MessagePack type in an extra
// trailing field, and refuses lengths the body cannot hold.
func TestSkipValues(t *testing.T) {
	dec := wire.NewDecoder()
	for _, extra := range []string{
		"c0", "c2", "c3", "7f", "e0", "cc ff", "cd ff ff", "ce 00 00 00 01", "cf 00 00 00 00 00 00 00 01",
		"d0 80", "d1 80 00", "d2 80 00 00 00", "d3 80 00 00 00 00 00 00 00", "ca 00 00 00 00", "cb 00 00 00 00 00 00 00 00",
		"a3 61 62 63", "d9 01 61", "da 00 01 61", "db 00 00 00 01 61", "c4 02 01 02", "c5 00 01 01", "c6 00 00 00 01 01",
		"d4 01 01", "d5 01 01 02", "d6 01 01 02 03 04", "d7 01 " + strings.Repeat("00 ", 8), "d8 01 " + strings.Repeat("00 ", 16),
		"c7 02 01 aa bb", "c8 00 01 01 aa", "c9 00 00 00 01 01 aa",
		"92 01 92 02 c0", "dc 00 02 01 02", "dd 00 00 00 01 c0", "82 01 02 a1 61 91 c0", "de 00 01 01 02", "df 00 00 00 01 c0 c0",
	} {
		if _, err := dec.WriteResponse(hx(t, "93 c0 05 "+extra)); err != nil {
			t.Errorf("extra %s: %v", extra, err)
		}
	}
	for _, bad := range []string{"c1", "a3 61", "c4 05 01", "dc 00 03 01 02", "df ff ff ff ff 01", "d8 01 00", "c9 ff ff ff ff 01"} {
		if _, err := dec.WriteResponse(hx(t, "93 c0 05 "+bad)); !errors.Is(err, celeriant.ErrProtocol) {
			t.Errorf("extra %s: %v, want ErrProtocol", bad, err)
		}
	}
}

// TestDeclaredCountsDoNotAllocate: an array header declaring millions of elements
// followed by garbage costs about the body itself, not the declared count times the
// size of a Go struct (which was 72 bytes per declared batch, 104 per event).
func TestDeclaredCountsDoNotAllocate(t *testing.T) {
	const size = 4 << 20
	dd := func(n int) string {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(n))
		return "dd " + hexBytes(b[:])
	}
	tests := []struct {
		name   string
		prefix string
		decode func(*wire.Decoder, []byte) error
	}{
		{"batches, one per byte", "93 c0 " + dd(size), readResponse},
		{"batches, one per 6 bytes", "93 c0 " + dd(size/6), readResponse},
		{"events, one per 9 bytes", "93 c0 91 95 01 01 c0 01 " + dd(size/9), readResponse},
		{"write events, one per 9 bytes", "94 c0 01 c0 81 93 01 01 01 94 " + dd(size/9), writeRequest},
		{"write entries, one per 9 bytes", "94 c0 01 c0 df " + dd(size / 9)[3:], writeRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := append(hx(t, tt.prefix), make([]byte, size)...) // zeros: not the elements
			dec := wire.NewDecoder()
			var err error
			n := allocated(func() { err = tt.decode(dec, body) })
			if !errors.Is(err, celeriant.ErrProtocol) {
				t.Fatalf("err = %v", err)
			}
			if n > 2*size {
				t.Fatalf("decoding a %d-byte body allocated %d bytes", len(body), n)
			}
		})
	}
}

func hexBytes(b []byte) string {
	const digits = "0123456789abcdef"
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte(digits[c>>4])
		sb.WriteByte(digits[c&15])
		sb.WriteByte(' ')
	}
	return sb.String()
}

func readResponse(d *wire.Decoder, b []byte) error { _, err := d.ReadResponse(b); return err }
func writeRequest(d *wire.Decoder, b []byte) error { _, err := d.WriteRequest(b); return err }

// TestWriteRequestManyEntries: duplicate-key collapsing stays linear, so a large
// multi-aggregate request (here 100,000 entries, about 8 MB) decodes quickly; a scan of
// the earlier entries per entry took minutes.
func TestWriteRequestManyEntries(t *testing.T) {
	const n = 100_000
	build := func(n int) (body []byte, dup celeriant.AggregateWrite) {
		req := celeriant.WriteRequest{ClientID: idClient}
		for i := range n {
			k := goldenKey
			binary.BigEndian.PutUint64(k.ID[8:], uint64(i))
			req.Writes = append(req.Writes, celeriant.AggregateWrite{Key: k, Events: []celeriant.Event{goldenEvent}, AllowCreate: true})
		}
		dup = req.Writes[n/2]
		dup.AllowCreate = false
		req.Writes = append(req.Writes, dup) // the encoder does not check; the decoder collapses
		return bytes.Clone(wire.NewEncoder().WriteRequest(&req)[wire.HeaderSize:]), dup
	}
	// The decoder must stay linear in the entries: a quadratic duplicate check
	// would take 100x as long for 10x the entries (about 5e9 comparisons at the
	// larger size: seconds, against milliseconds). The thread's CPU time of the
	// fastest of five runs of each size, interleaved, with the collector off (its
	// cycles, not the decoder, grew with the heap on a busy machine), is compared: a
	// ratio within one run that other processes' load does not inflate.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	small, _ := build(n / 10)
	large, dup := build(n)
	tSmall, tLarge := time.Duration(1<<62), time.Duration(1<<62)
	var got celeriant.WriteRequest
	decode := func(body []byte) (time.Duration, celeriant.WriteRequest) {
		start := threadCPU()
		r, err := wire.NewDecoder().WriteRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		return threadCPU() - start, r
	}
	for range 5 {
		runtime.GC()
		d, _ := decode(small)
		tSmall = min(tSmall, d)
		runtime.GC()
		d, got = decode(large)
		tLarge = min(tLarge, d)
	}
	if len(got.Writes) != n || got.Writes[n/2].AllowCreate || got.Writes[n/2].Key != dup.Key {
		t.Fatalf("%d entries; the duplicate did not replace entry %d", len(got.Writes), n/2)
	}
	if ratio := float64(tLarge) / float64(max(tSmall, time.Microsecond)); ratio > 40 {
		t.Fatalf("decoding %d entries took %v of CPU, %d took %v: %.0fx for 10x the entries", n, tLarge, n/10, tSmall, ratio)
	}
}

// TestReadFrameMemoryFollowsData: a header declaring 16 MiB followed by a few bytes
// costs memory for what arrived, not for what was declared.
func TestReadFrameMemoryFollowsData(t *testing.T) {
	const declared = 16 << 20
	frame := wire.AppendHeader(nil, wire.Header{Version: 3, Type: wire.ReqWrite, CompressedLength: declared, UncompressedLength: declared})
	frame = append(frame, 1, 2, 3)
	check := func(h wire.Header) error { return h.CheckRequest(declared) }
	var err error
	n := allocated(func() { _, _, err = wire.ReadFrame(bytes.NewReader(frame), nil, check) })
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if n > 1<<20 {
		t.Fatalf("a truncated frame declaring %d bytes allocated %d", declared, n)
	}
	// A complete large body still arrives intact, and a reused buffer is reused.
	body := bytes.Repeat([]byte("0123456789abcdef"), 300_000)
	frame = append(wire.AppendHeader(nil, wire.Header{Version: 3, Type: wire.ReqWrite, CompressedLength: uint32(len(body)), UncompressedLength: uint32(len(body))}), body...)
	_, got, err := wire.ReadFrame(bytes.NewReader(frame), nil, check)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("large body: %v", err)
	}
	_, again, err := wire.ReadFrame(bytes.NewReader(frame), got, check)
	if err != nil || !bytes.Equal(again, body) || &again[0] != &got[0] {
		t.Fatalf("reuse: %v", err)
	}
}

// TestIVLength: the server reads the IV as exactly 12 bytes and drops the connection
// otherwise, so a bad IV is refused before sending (ErrNotSent, not ErrOutcomeUnknown),
// the simulator's decoder is as strict, and an empty IV is sent as absent.
func TestIVLength(t *testing.T) {
	_, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	w := simpleWrite(freshKey(), uuid.New(), 1)
	w.Writes[0].Events[0].IV = []byte{1, 2, 3, 4, 5}
	if _, err := c.Write(context.Background(), w); !errors.Is(err, celeriant.ErrNotSent) || !errors.Is(err, celeriant.ErrInvalidRequest) {
		t.Fatalf("5-byte IV: %v", err)
	}
	w.Writes[0].Events[0].IV = bytes.Repeat([]byte{7}, 12)
	if _, err := c.Write(context.Background(), w); err != nil {
		t.Fatalf("12-byte IV: %v", err)
	}
	res, err := c.Read(context.Background(), celeriant.ReadRequest{Key: w.Writes[0].Key})
	if err != nil || !bytes.Equal(res.Batches[0].Events[0].IV, w.Writes[0].Events[0].IV) {
		t.Fatalf("IV read back: %+v %v", res, err)
	}

	enc, dec := wire.NewEncoder(), wire.NewDecoder()
	g := goldenWriteRequest()
	g.Writes[0].Events[0].IV = []byte{}
	if got := enc.WriteRequest(&g); !bytes.Equal(got[wire.HeaderSize:], hx(t, vWriteReqBody)) {
		t.Fatalf("empty IV not sent as nil: %x", got)
	}
	bad := strings.Replace(vWriteReqBody, "7d c0 c3 00 c3", "7d c4 05 01 02 03 04 05 c3 00 c3", 1)
	if _, err := dec.WriteRequest(hx(t, bad)); !errors.Is(err, celeriant.ErrProtocol) {
		t.Fatalf("request with a 5-byte IV decoded: %v", err)
	}
}

// TestResponseVersion: the server answers in the request's protocol version; a version 2
// (bincode) answer to a version 3 request is a protocol error, even if its body happens
// to decode as MessagePack.
func TestResponseVersion(t *testing.T) {
	addr := fakeServer(t, func(req []byte) []byte {
		body := append(append([]byte{0x92}, req[1:19]...), 0x05) // echo the correlation id
		h := wire.Header{Version: 2, Type: wire.RespWrite, CompressedLength: uint32(len(body)), UncompressedLength: uint32(len(body))}
		return append(wire.AppendHeader(nil, h), body...)
	})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	_, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1))
	if !errors.Is(err, celeriant.ErrOutcomeUnknown) || !errors.Is(err, celeriant.ErrProtocol) {
		t.Fatalf("err = %v", err)
	}
}

// TestConnectionReset: a reset after the write was sent is ErrOutcomeUnknown; for a read
// ErrTransport.
func TestConnectionReset(t *testing.T) {
	addr := serveConns(t, func(nc net.Conn) {
		_, _, _ = wire.ReadFrame(nc, nil, func(wire.Header) error { return nil })
		_ = nc.(*net.TCPConn).SetLinger(0) // close with RST
		_ = nc.Close()
	})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	_, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1))
	if !errors.Is(err, celeriant.ErrOutcomeUnknown) || errors.Is(err, celeriant.ErrNotSent) {
		t.Fatalf("write: %v", err)
	}
	_, err = c.Read(context.Background(), celeriant.ReadRequest{Key: freshKey()})
	if !errors.Is(err, celeriant.ErrTransport) {
		t.Fatalf("read: %v", err)
	}
}

// TestSlowLorisServer: a server that trickles its answer a byte at a time cannot hold a
// request past its deadline (Config.RequestTimeout when the context has none): the
// deadline is absolute, not renewed per byte.
func TestSlowLorisServer(t *testing.T) {
	stop := make(chan struct{})
	addr := serveConns(t, func(nc net.Conn) {
		defer nc.Close()
		_, _, _ = wire.ReadFrame(nc, nil, func(wire.Header) error { return nil })
		// A read answer (of any size, unlike a write's) of 1 MiB, a byte every 10 ms: it
		// never ends before the test does, so only an absolute deadline ends the request.
		const size = 1 << 20
		answer := wire.AppendHeader(nil, wire.Header{Version: 3, Type: wire.RespRead, CompressedLength: size, UncompressedLength: size})
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			b := byte(0)
			if i < len(answer) {
				b = answer[i]
			}
			if _, err := nc.Write([]byte{b}); err != nil {
				return
			}
		}
	})
	t.Cleanup(func() { close(stop) }) // runs before serveConns closes the listener
	// A loaded machine may spend the whole timeout before the request is even sent
	// (ErrNotSent): then the case is tried again with twice the timeout.
	for timeout := 200 * time.Millisecond; ; timeout *= 2 {
		c := newClient(t, celeriant.Config{Addrs: []string{addr}, RequestTimeout: timeout})
		done := make(chan error, 1)
		go func() { _, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1)); done <- err }()
		var err error
		select {
		case err = <-done:
		case <-time.After(timeout + time.Minute):
			t.Fatalf("a request with a %v timeout still waits for a trickled answer after a minute more", timeout)
		}
		if errors.Is(err, celeriant.ErrNotSent) && timeout < 10*time.Second {
			continue
		}
		if !errors.Is(err, celeriant.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		return
	}
}
