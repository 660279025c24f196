package celeriant_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

func fuzzSeeds(f *testing.F) {
	for _, body := range []string{vWriteReqBody, vReadReqBody, vDetReqBody, vWriteResBody, vErrBody, vReadResBody} {
		f.Add(hx(f, body))
	}
	f.Add([]byte{})
	f.Add([]byte{0x93, 0xc0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x94, 0xc0, 0xc4, 0x10})
}

// FuzzDecoders feeds arbitrary bodies to every message decoder: errors are fine, panics
// are not. Decoded write requests and read responses must survive a re-encode.
func FuzzDecoders(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		dec, enc := wire.NewDecoder(), wire.NewEncoder()
		if req, err := dec.WriteRequest(body); err == nil {
			frame := bytes.Clone(enc.WriteRequest(&req))
			again, err := dec.WriteRequest(frame[wire.HeaderSize:])
			if err != nil || !reflect.DeepEqual(again, req) {
				t.Fatalf("write request does not round-trip: %v\n%+v\n%+v", err, req, again)
			}
		}
		_, _ = dec.ReadRequest(body)
		_, _, _ = dec.AggregateDetailsRequest(body)
		_, _ = dec.WriteResponse(body)
		if res, err := dec.ReadResponse(body); err == nil {
			frame := bytes.Clone(enc.ReadResponse(&res))
			again, err := dec.ReadResponse(frame[wire.HeaderSize:])
			if err != nil || !reflect.DeepEqual(again, res) {
				t.Fatalf("read response does not round-trip: %v\n%+v\n%+v", err, res, again)
			}
		}
		_, _ = dec.AggregateDetailsResponse(body)
		_, _ = dec.ErrorResponse(body)
	})
}

// FuzzReadFrame feeds arbitrary bytes to the frame reader.
func FuzzReadFrame(f *testing.F) {
	for _, fr := range [][2]string{{vWriteResHdr, vWriteResBody}, {vErrHdr, vErrBody}, {vReadResHdr, vReadResBody}} {
		f.Add(append(hx(f, fr[0]), hx(f, fr[1])...))
	}
	f.Add(hx(f, "03000000 02000000 ffffffff ffffffff 00"))
	f.Add([]byte{3})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, body, err := wire.ReadFrame(bytes.NewReader(data), nil, func(h wire.Header) error { return h.CheckResponse(1 << 16) })
		if err == nil && uint32(len(body)) != h.CompressedLength {
			t.Fatalf("body of %d bytes for header %+v", len(body), h)
		}
	})
}
