package celeriant_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// TestSimClosesOnMalformedFrames: like the server, the simulator answers malformed input
// by closing the connection without a frame, and keeps serving other connections.
func TestSimClosesOnMalformedFrames(t *testing.T) {
	_, addr := startSim(t, celeriantsim.Options{MaxRequestSize: 1 << 20})
	closesOnMalformed(t, addr, 1<<20, true)
}

// closesOnMalformed sends malformed frames to addr, each on a connection of its own,
// and checks that each connection is closed without an answer, then that addr still
// serves. maxRequest is the server's request size limit; sim adds the frames only the
// simulator refuses (bincode, and a Watch it cannot decode).
func closesOnMalformed(t *testing.T, addr string, maxRequest uint32, sim bool) {
	enc := wire.NewEncoder()
	valid := bytes.Clone(enc.AggregateDetailsRequest(uuid.Nil, goldenKey))
	withHeader := func(h wire.Header, body []byte) []byte { return append(wire.AppendHeader(nil, h), body...) }
	over := maxRequest + 1
	tests := []struct {
		name  string
		frame []byte
	}{
		{"truncated header", valid[:10]},
		{"truncated body", valid[:len(valid)-3]},
		{"version 9", withHeader(wire.Header{Version: 9, Type: 1, CompressedLength: 57, UncompressedLength: 57}, valid[17:])},
		{"over the size limit", withHeader(wire.Header{Version: 3, Type: 3, CompressedLength: over, UncompressedLength: over}, nil)},
		{"fixed-size over 1007", withHeader(wire.Header{Version: 3, Type: 1, CompressedLength: 1008, UncompressedLength: 1008}, make([]byte, 1008))},
		{"compression 7", withHeader(wire.Header{Version: 3, Type: 3, CompressedLength: 3, UncompressedLength: 3, Compression: 7}, []byte{1, 2, 3})},
		{"unknown type", withHeader(wire.Header{Version: 3, Type: 99, CompressedLength: 1, UncompressedLength: 1}, []byte{0xc0})},
		{"garbage msgpack", withHeader(wire.Header{Version: 3, Type: 3, CompressedLength: 5, UncompressedLength: 5}, []byte{0xc1, 0xff, 0x00, 0x93, 0xdd})},
		{"write with 3 fields", withHeader(wire.Header{Version: 3, Type: 3, CompressedLength: 4, UncompressedLength: 4}, []byte{0x93, 0xc0, 0xc0, 0xc0})},
	}
	if sim {
		tests = append(tests, []struct {
			name  string
			frame []byte
		}{
			{"version 2 (bincode, not simulated)", withHeader(wire.Header{Version: 2, Type: 1, CompressedLength: 57, UncompressedLength: 57}, valid[17:])},
			{"watch (not simulated)", withHeader(wire.Header{Version: 3, Type: 6, CompressedLength: 1, UncompressedLength: 1}, []byte{0xc0})},
		}...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := nc.Write(tt.frame); err != nil {
				t.Fatal(err)
			}
			if tc, ok := nc.(*net.TCPConn); ok && len(tt.frame) < 17+57 {
				_ = tc.CloseWrite() // truncated input: the server sees EOF mid-frame
			}
			got, err := io.ReadAll(nc)
			if len(got) != 0 {
				t.Fatalf("got %d bytes of answer (% x), want the connection closed without one", len(got), got[:min(len(got), 64)])
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("connection left open")
			}
		})
	}
	// Still serving.
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	if _, err := c.AggregateDetails(context.Background(), freshKey()); !celeriant.IsNotFound(err) {
		t.Fatalf("after malformed input: %v", err)
	}
}

// fakeServer answers the first request frame of each connection with answer(frameBody),
// then closes the connection (nil: closes at once).
func fakeServer(t *testing.T, answer func(req []byte) []byte) string {
	t.Helper()
	return serveConns(t, func(nc net.Conn) {
		defer nc.Close()
		_, body, err := wire.ReadFrame(nc, nil, func(wire.Header) error { return nil })
		if err != nil {
			return
		}
		if out := answer(body); out != nil {
			_, _ = nc.Write(out)
		}
	})
}

// TestClientMalformedAnswers: bad answers are errors (wrapping ErrProtocol where the bytes
// were wrong), never panics; a write gets ErrOutcomeUnknown, a read ErrTransport.
func TestClientMalformedAnswers(t *testing.T) {
	hdr := func(typ wire.MessageType, n uint32, comp uint8) []byte {
		return wire.AppendHeader(nil, wire.Header{Version: 3, Type: typ, CompressedLength: n, UncompressedLength: n, Compression: comp})
	}
	tests := []struct {
		name     string
		answer   []byte
		protocol bool
	}{
		{"close", nil, false},
		{"truncated header", []byte{3, 0, 0}, false},
		{"version 7", wire.AppendHeader(nil, wire.Header{Version: 7, Type: 3, CompressedLength: 1, UncompressedLength: 1}), true},
		{"1 GiB body", hdr(wire.RespRead, 1<<30, 0), true},
		{"compressed", append(hdr(wire.RespRead, 3, 1), 1, 2, 3), true},
		{"garbage body", append(hdr(wire.RespWrite, 3, 0), 0xc1, 0xc1, 0xc1), true},
		{"garbage read body", append(hdr(wire.RespRead, 4, 0), 0x93, 0xc0, 0xdd, 0xff), true},
		{"garbage error body", append(hdr(wire.RespError, 3, 0), 0x93, 0xc0, 0xc0), true},
		{"unexpected type", append(hdr(wire.RespTrimStart, 2, 0), 0x91, 0xc0), true},
		{"wrong correlation id", append(hdr(wire.RespWrite, 20, 0), append(append([]byte{0x92, 0xc4, 0x10}, bytes.Repeat([]byte{9}, 16)...), 0x05)...), true},
		{"short body", append(hdr(wire.RespWrite, 10, 0), 0x92), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := fakeServer(t, func([]byte) []byte { return tt.answer })
			c := newClient(t, celeriant.Config{Addrs: []string{addr}})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := c.Write(ctx, simpleWrite(freshKey(), uuid.New(), 1))
			if !errors.Is(err, celeriant.ErrOutcomeUnknown) {
				t.Fatalf("write: %v", err)
			}
			if errors.Is(err, celeriant.ErrProtocol) != tt.protocol {
				t.Fatalf("write: ErrProtocol = %v: %v", !tt.protocol, err)
			}
			_, err = c.Read(ctx, celeriant.ReadRequest{Key: freshKey()})
			if !errors.Is(err, celeriant.ErrTransport) || errors.Is(err, celeriant.ErrOutcomeUnknown) {
				t.Fatalf("read: %v", err)
			}
		})
	}
}
