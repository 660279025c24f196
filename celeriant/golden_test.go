package celeriant_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// hx turns the notation of docs/celeriant-protocol.md section 8.3 into bytes: hex byte groups
// separated by spaces, B(xy) = c4 10 followed by sixteen 0xxy bytes, and "s:TEXT" for the
// ASCII bytes of TEXT (no spaces).
func hx(t testing.TB, s string) []byte {
	t.Helper()
	var out []byte
	for _, tok := range strings.Fields(s) {
		switch {
		case strings.HasPrefix(tok, "B(") && strings.HasSuffix(tok, ")"):
			b, err := hex.DecodeString(tok[2:4])
			if err != nil {
				t.Fatalf("bad token %q", tok)
			}
			out = append(out, 0xc4, 0x10)
			out = append(out, bytes.Repeat(b, 16)...)
		case strings.HasPrefix(tok, "s:"):
			out = append(out, tok[2:]...)
		default:
			b, err := hex.DecodeString(tok)
			if err != nil {
				t.Fatalf("bad token %q: %v", tok, err)
			}
			out = append(out, b...)
		}
	}
	return out
}

func rep(b byte) uuid.UUID {
	var u uuid.UUID
	for i := range u {
		u[i] = b
	}
	return u
}

var (
	idOrg, idType, idAgg = rep(0x11), rep(0x22), rep(0x33)
	idClient, idEvent    = rep(0x44), rep(0x55)
	idCorr               = rep(0x66)
	goldenKey            = celeriant.AggregateKey{Org: idOrg, Type: idType, ID: idAgg}
	goldenEvent          = celeriant.Event{ClientSeq: 1, EventID: idEvent, Timestamp: 1700000000000, TypeMajor: 1, Value: []byte(`{"a":1}`)}
)

// The vectors of docs/celeriant-protocol.md section 8.3, header and body.
const (
	vWriteReqHdr  = "03000000 03000000 7c000000 7c000000 00"
	vWriteReqBody = "94 c0 B(44) c0 81 93 B(11) B(22) B(33) 94 91 98 01 00 B(55) cf 00 00 01 8b cf e5 68 00 01 00 c4 07 7b 22 61 22 3a 31 7d c0 c3 00 c3"
	vReadReqHdr   = "03000000 02000000 6b000000 6b000000 00"
	vReadReqBody  = "93 B(66) 93 B(11) B(22) B(33) 9f 01 c0 c0 c0 B(44) c0 c0 c0 c0 07 07 c0 c0 c0 c0"
	vDetReqHdr    = "03000000 01000000 39000000 39000000 00"
	vDetReqBody   = "92 c0 93 B(11) B(22) B(33)"
	vWriteResHdr  = "03000000 03000000 03000000 03000000 00"
	vWriteResBody = "92 c0 05"
	vErrHdr       = "03000000 07000000 35000000 35000000 00"
	vErrBody      = `93 c0 cd 07 d2 d9 2e s:{"last_client_seq":7,"attempted_client_seq":7}`
	vReadResHdr   = "03000000 02000000 5e000000 5e000000 00"
	vReadResBody  = "93 B(66) 91 95 05 B(44) c0 cf 00 00 01 8b cf e5 68 7b 91 98 07 0c B(55) cf 00 00 01 8b cf e5 68 00 01 00 c4 07 7b 22 61 22 3a 31 7d c0 c0"
)

func goldenWriteRequest() celeriant.WriteRequest {
	return celeriant.WriteRequest{ClientID: idClient, Writes: []celeriant.AggregateWrite{{
		Key: goldenKey, Events: []celeriant.Event{goldenEvent},
		AllowCreate: true, ExpectedVersion: celeriant.Version(0), EnforceClientIdempotency: true,
	}}}
}

func goldenReadRequest() celeriant.ReadRequest {
	return celeriant.ReadRequest{CorrelationID: idCorr, Key: goldenKey, Filters: celeriant.ReadFilters{
		FromVersion: 1, IncludeClientID: idClient, MinClientSeq: celeriant.Uint64(7), MaxClientSeq: celeriant.Uint64(7),
	}}
}

func goldenReadResult() celeriant.ReadResult {
	ev := goldenEvent
	ev.ClientSeq, ev.EventSeq = 7, 12
	return celeriant.ReadResult{CorrelationID: idCorr, Batches: []celeriant.Batch{{
		Version: 5, ClientID: idClient, ServerTimestamp: 1700000000123, Events: []celeriant.Event{ev},
	}}}
}

func TestGoldenEncode(t *testing.T) {
	enc := wire.NewEncoder()
	wreq, rreq, rres := goldenWriteRequest(), goldenReadRequest(), goldenReadResult()
	tests := []struct {
		name       string
		frame      func() []byte
		hdr, body  string
		wantLength int
	}{
		{"WriteRequest", func() []byte { return enc.WriteRequest(&wreq) }, vWriteReqHdr, vWriteReqBody, 124},
		{"ReadRequest", func() []byte { return enc.ReadRequest(&rreq) }, vReadReqHdr, vReadReqBody, 107},
		{"AggregateDetailsRequest", func() []byte { return enc.AggregateDetailsRequest(uuid.Nil, goldenKey) }, vDetReqHdr, vDetReqBody, 57},
		{"WriteResponse", func() []byte { return enc.WriteResponse(&celeriant.WriteResult{Version: 5}) }, vWriteResHdr, vWriteResBody, 3},
		{"ErrorResponse2002", func() []byte {
			return enc.ErrorResponse(uuid.Nil, uint32(celeriant.CodeWriteClientIdempotency), `{"last_client_seq":7,"attempted_client_seq":7}`)
		}, vErrHdr, vErrBody, 53},
		{"ReadResponse", func() []byte { return enc.ReadResponse(&rres) }, vReadResHdr, vReadResBody, 94},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := append(hx(t, tt.hdr), hx(t, tt.body)...)
			got := bytes.Clone(tt.frame())
			if !bytes.Equal(got, want) {
				t.Fatalf("frame mismatch\n got %x\nwant %x", got, want)
			}
			h, err := wire.ParseHeader(got)
			if err != nil {
				t.Fatal(err)
			}
			body := len(got) - wire.HeaderSize
			if body != tt.wantLength || int(h.CompressedLength) != body || int(h.UncompressedLength) != body {
				t.Fatalf("lengths: header %d/%d, body %d, want %d", h.CompressedLength, h.UncompressedLength, body, tt.wantLength)
			}
		})
	}
}

func TestGoldenDecode(t *testing.T) {
	dec := wire.NewDecoder()
	t.Run("WriteRequest", func(t *testing.T) {
		got, err := dec.WriteRequest(hx(t, vWriteReqBody))
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, got, goldenWriteRequest())
	})
	t.Run("ReadRequest", func(t *testing.T) {
		got, err := dec.ReadRequest(hx(t, vReadReqBody))
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, got, goldenReadRequest())
	})
	t.Run("AggregateDetailsRequest", func(t *testing.T) {
		corr, key, err := dec.AggregateDetailsRequest(hx(t, vDetReqBody))
		if err != nil || corr != uuid.Nil || key != goldenKey {
			t.Fatalf("got %v %v %v", corr, key, err)
		}
	})
	t.Run("WriteResponse", func(t *testing.T) {
		got, err := dec.WriteResponse(hx(t, vWriteResBody))
		if err != nil || got != (celeriant.WriteResult{Version: 5}) {
			t.Fatalf("got %+v %v", got, err)
		}
	})
	t.Run("ErrorResponse", func(t *testing.T) {
		ef, err := dec.ErrorResponse(hx(t, vErrBody))
		if err != nil {
			t.Fatal(err)
		}
		se := celeriant.NewServerError(celeriant.Code(ef.Code), ef.Message)
		if se.Code != 2002 || se.LastClientSeq != 7 || se.AttemptedClientSeq != 7 || !errors.Is(se, celeriant.ErrIdempotencyViolation) {
			t.Fatalf("got %+v", se)
		}
	})
	t.Run("ReadResponse", func(t *testing.T) {
		got, err := dec.ReadResponse(hx(t, vReadResBody))
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, got, goldenReadResult())
	})
}

// TestDecodeLeniency feeds the decoders what the server also accepts or may send:
// non-minimal integer widths, a 7-element event, integer ids, extra trailing elements.
func TestDecodeLeniency(t *testing.T) {
	dec := wire.NewDecoder()
	t.Run("non-minimal ints in WriteResponse", func(t *testing.T) {
		for _, five := range []string{"cc 05", "cd 00 05", "ce 00 00 00 05", "cf 00 00 00 00 00 00 00 05", "d0 05", "d3 00 00 00 00 00 00 00 05"} {
			got, err := dec.WriteResponse(hx(t, "92 c0 "+five))
			if err != nil || got.Version != 5 {
				t.Errorf("%s: got %+v %v", five, got, err)
			}
		}
	})
	t.Run("7-element event in a write request", func(t *testing.T) {
		body := strings.Replace(vWriteReqBody, "91 98 01 00", "91 97 01 00", 1)
		body = strings.Replace(body, "7d c0 c3 00 c3", "7d c3 00 c3", 1)
		got, err := dec.WriteRequest(hx(t, body))
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, got, goldenWriteRequest())
	})
	t.Run("7-element event and extra fields in a read response", func(t *testing.T) {
		body := strings.Replace(vReadResBody, "91 98 07 0c", "91 97 07 0c", 1)
		body = strings.Replace(body, "7d c0 c0", "7d c0", 1) // drop iv, keep next version nil
		got, err := dec.ReadResponse(hx(t, body))
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, got, goldenReadResult())
		extra := "94" + strings.TrimPrefix(vReadResBody, "93") + " c3"
		if _, err := dec.ReadResponse(hx(t, extra)); err != nil {
			t.Fatalf("extra trailing element: %v", err)
		}
	})
	t.Run("integer id", func(t *testing.T) {
		got, _, err := dec.AggregateDetailsRequest(hx(t, "92 2a 93 B(11) B(22) B(33)"))
		if err != nil || got != (uuid.UUID{15: 42}) {
			t.Fatalf("got %v %v", got, err)
		}
	})
}

func TestDecodeRejects(t *testing.T) {
	dec := wire.NewDecoder()
	tests := []struct{ name, body string }{
		{"bin16 id", "92 c0 93 c5 00 10 " + strings.Repeat("11 ", 16) + "B(22) B(33)"},
		{"id of 15 bytes", "92 c0 93 c4 0f " + strings.Repeat("11 ", 15) + "B(22) B(33)"},
		{"negative id", "92 ff 93 B(11) B(22) B(33)"},
		{"key of 2 ids", "92 c0 92 B(11) B(22)"},
		{"extra field in request", "93 c0 93 B(11) B(22) B(33) c0"},
		{"truncated", "92 c0 93 B(11) B(22) c4 10 33"},
		{"empty", ""},
		{"not an array", "c3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := dec.AggregateDetailsRequest(hx(t, tt.body)); !errors.Is(err, celeriant.ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
	for _, neg := range []string{"ff", "e0", "d0 ff", "d1 80 00", "d2 ff ff ff ff", "d3 80 00 00 00 00 00 00 00", "ca 00 00 00 00", "a1 35"} {
		t.Run("version "+neg, func(t *testing.T) {
			if _, err := dec.WriteResponse(hx(t, "92 c0 "+neg)); !errors.Is(err, celeriant.ErrProtocol) {
				t.Fatalf("err = %v", err)
			}
		})
	}
	t.Run("bin16 event value", func(t *testing.T) {
		body := strings.Replace(vReadResBody, "c4 07 7b", "c5 00 07 7b", 1)
		got, err := dec.ReadResponse(hx(t, body))
		if err != nil || string(got.Batches[0].Events[0].Value) != `{"a":1}` {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("event value as str", func(t *testing.T) {
		body := strings.Replace(vReadResBody, "c4 07 7b", "a7 7b", 1)
		if _, err := dec.ReadResponse(hx(t, body)); !errors.Is(err, celeriant.ErrProtocol) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("9-element event in a request", func(t *testing.T) {
		body := strings.Replace(vWriteReqBody, "91 98 01 00", "91 99 01 00", 1)
		body = strings.Replace(body, "7d c0 c3 00 c3", "7d c0 c0 c3 00 c3", 1)
		if _, err := dec.WriteRequest(hx(t, body)); !errors.Is(err, celeriant.ErrProtocol) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("huge array header", func(t *testing.T) {
		if _, err := dec.ReadResponse(hx(t, "93 c0 dd ff ff ff ff")); !errors.Is(err, celeriant.ErrProtocol) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestEventIV: on the wire an event's iv is nil or exactly 12 bytes, as the server's
// Option<[u8; 12]> serde helper reads and writes it; an empty bin (c4 00) or any other
// length is malformed in a read response as in a write request, and an empty Event.IV
// is sent as nil. Before this rule a response's empty iv decoded as an empty slice and
// re-encoded as nil, so decode, encode, decode disagreed (FuzzDecoders found it).
func TestEventIV(t *testing.T) {
	dec := wire.NewDecoder()
	iv := func(n int) string {
		if n < 0 {
			return "c0"
		}
		return fmt.Sprintf("c4 %02x ", n) + strings.Repeat("ab ", n)
	}
	for _, tt := range []struct {
		n  int // -1: nil
		ok bool
	}{{-1, true}, {12, true}, {0, false}, {1, false}, {11, false}, {13, false}} {
		t.Run(fmt.Sprintf("iv %d", tt.n), func(t *testing.T) {
			res := strings.Replace(vReadResBody, "7d c0 c0", "7d "+iv(tt.n)+" c0", 1)
			got, err := dec.ReadResponse(hx(t, res))
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, celeriant.ErrProtocol)) {
				t.Fatalf("read response: err = %v, want ok=%v", err, tt.ok)
			}
			if err == nil && len(got.Batches[0].Events[0].IV) != max(tt.n, 0) {
				t.Fatalf("read response: iv %x", got.Batches[0].Events[0].IV)
			}
			req := strings.Replace(vWriteReqBody, "7d c0 c3 00 c3", "7d "+iv(tt.n)+" c3 00 c3", 1)
			if _, err := dec.WriteRequest(hx(t, req)); tt.ok != (err == nil) || (err != nil && !errors.Is(err, celeriant.ErrProtocol)) {
				t.Fatalf("write request: err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	t.Run("empty IV is sent as nil", func(t *testing.T) {
		enc := wire.NewEncoder()
		res := celeriant.ReadResult{CorrelationID: idCorr, Batches: []celeriant.Batch{{Version: 5, ClientID: idClient, ServerTimestamp: 1700000000123, Events: []celeriant.Event{goldenEvent}}}}
		want := bytes.Clone(enc.ReadResponse(&res))
		res.Batches[0].Events[0].IV = []byte{}
		if got := enc.ReadResponse(&res); !bytes.Equal(got, want) {
			t.Fatalf("empty IV encodes as\n%x, want\n%x", got, want)
		}
	})
}

// TestHeader covers the header layout and the server's rejection rules (docs/celeriant-protocol.md
// sections 2.1-2.2, wire_header.rs vectors cited in section 8.3).
func TestHeader(t *testing.T) {
	h, err := wire.ParseHeader(hx(t, "02000000 78563412 ddccbbaa 44332211 01"))
	if err != nil {
		t.Fatal(err)
	}
	want := wire.Header{Version: 2, Type: 0x12345678, CompressedLength: 0xAABBCCDD, UncompressedLength: 0x11223344, Compression: 1}
	if h != want {
		t.Fatalf("got %+v want %+v", h, want)
	}
	if got := wire.AppendHeader(nil, want); !bytes.Equal(got, hx(t, "02000000 78563412 ddccbbaa 44332211 01")) {
		t.Fatalf("AppendHeader = %x", got)
	}
	if _, err := wire.ParseHeader(make([]byte, 16)); !errors.Is(err, celeriant.ErrProtocol) {
		t.Fatalf("short header: %v", err)
	}
	const max = 1 << 20
	ok := wire.Header{Version: 3, Type: wire.ReqWrite, CompressedLength: 100, UncompressedLength: 100}
	tests := []struct {
		name   string
		mutate func(*wire.Header)
		ok     bool
	}{
		{"valid write", func(*wire.Header) {}, true},
		{"version 2", func(h *wire.Header) { h.Version = 2 }, true},
		{"version 1", func(h *wire.Header) { h.Version = 1 }, false},
		{"version 4", func(h *wire.Header) { h.Version = 4 }, false},
		{"compression 1 variable", func(h *wire.Header) { h.Compression, h.UncompressedLength = 1, 300 }, true},
		{"compression 2", func(h *wire.Header) { h.Compression = 2 }, false},
		{"compression 3", func(h *wire.Header) { h.Compression = 3 }, false},
		{"compression 4", func(h *wire.Header) { h.Compression = 4 }, false},
		{"compression 5", func(h *wire.Header) { h.Compression = 5 }, false},
		{"compression 255", func(h *wire.Header) { h.Compression = 255 }, false},
		{"at the limit", func(h *wire.Header) { h.CompressedLength, h.UncompressedLength = max, max }, true},
		{"compressed over the limit", func(h *wire.Header) { h.CompressedLength, h.UncompressedLength = max+1, max+1 }, false},
		{"uncompressed over the limit", func(h *wire.Header) { h.Compression, h.UncompressedLength = 1, max+1 }, false},
		{"lengths differ uncompressed", func(h *wire.Header) { h.UncompressedLength = 101 }, false},
		{"fixed at 1007", func(h *wire.Header) {
			h.Type, h.CompressedLength, h.UncompressedLength = wire.ReqRead, 1007, 1007
		}, true},
		{"fixed at 1008", func(h *wire.Header) {
			h.Type, h.CompressedLength, h.UncompressedLength = wire.ReqRead, 1008, 1008
		}, false},
		{"fixed compressed", func(h *wire.Header) { h.Type, h.Compression = wire.ReqAggregateDetails, 1 }, false},
		{"unknown type 11", func(h *wire.Header) { h.Type = 11 }, false},
		{"unknown type 0", func(h *wire.Header) { h.Type = 0 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ok
			tt.mutate(&h)
			err := h.CheckRequest(max)
			if (err == nil) != tt.ok {
				t.Fatalf("CheckRequest(%+v) = %v, want ok=%v", h, err, tt.ok)
			}
			if err != nil && !errors.Is(err, celeriant.ErrProtocol) {
				t.Fatalf("error does not wrap ErrProtocol: %v", err)
			}
		})
	}
	// Responses: Write and Error are fixed-size, Read is variable.
	for _, tt := range []struct {
		typ wire.MessageType
		n   uint32
		ok  bool
	}{{wire.RespError, 1007, true}, {wire.RespError, 1008, false}, {wire.RespWrite, 2000, false}, {wire.RespRead, 5000, true}, {13, 1, false}} {
		h := wire.Header{Version: 3, Type: tt.typ, CompressedLength: tt.n, UncompressedLength: tt.n}
		if err := h.CheckResponse(max); (err == nil) != tt.ok {
			t.Errorf("CheckResponse(%+v) = %v, want ok=%v", h, err, tt.ok)
		}
	}
}

func TestReadFrame(t *testing.T) {
	check := func(h wire.Header) error { return h.CheckResponse(1 << 20) }
	full := append(hx(t, vWriteResHdr), hx(t, vWriteResBody)...)
	h, body, err := wire.ReadFrame(bytes.NewReader(full), nil, check)
	if err != nil || h.Type != wire.RespWrite || !bytes.Equal(body, hx(t, vWriteResBody)) {
		t.Fatalf("got %+v %x %v", h, body, err)
	}
	for n := 0; n < len(full); n++ {
		if _, _, err := wire.ReadFrame(bytes.NewReader(full[:n]), nil, check); err == nil {
			t.Fatalf("truncated to %d bytes: no error", n)
		}
	}
	over := hx(t, "03000000 02000000 01001000 01001000 00")
	if _, _, err := wire.ReadFrame(bytes.NewReader(over), nil, check); !errors.Is(err, celeriant.ErrProtocol) {
		t.Fatalf("over the limit: %v", err)
	}
}

func TestCheckRead(t *testing.T) {
	req, err := celeriant.CheckRead(celeriant.ReadRequest{Key: goldenKey})
	if err != nil || req.Filters.FromVersion != 1 {
		t.Fatalf("FromVersion 0: got %d, %v", req.Filters.FromVersion, err)
	}
	enc := wire.NewEncoder()
	for _, n := range []int{0, 1, 15, 16, 200, 300, 1000} {
		r := goldenReadRequest()
		r.Filters.EventTypes = make([]uint64, n)
		for i := range r.Filters.EventTypes {
			r.Filters.EventTypes[i] = uint64(i * 1000)
		}
		size := len(enc.ReadRequest(&r)) - wire.HeaderSize
		_, err := celeriant.CheckRead(r)
		if (err == nil) != (size <= wire.MaxFixedBody) {
			t.Errorf("%d event types, %d bytes: CheckRead = %v", n, size, err)
		}
		if err != nil && !(errors.Is(err, celeriant.ErrNotSent) && errors.Is(err, celeriant.ErrInvalidRequest)) {
			t.Errorf("error kinds: %v", err)
		}
	}
}
