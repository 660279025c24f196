package celeriant

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// ErrInvalidRequest is wrapped (together with ErrNotSent) by the errors of CheckWrite
// and CheckRead: the request was refused before anything was sent.
var ErrInvalidRequest = errors.New("celeriant: invalid request")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %w: "+format, append([]any{ErrNotSent, ErrInvalidRequest}, args...)...)
}

// CheckWrite applies the client-side rules every EventStore applies before sending a
// write: a non-nil ClientID, distinct aggregate keys (the wire form is a map) and an IV
// that is absent or 12 bytes (the server cannot decode another length and would drop the
// connection without an answer, docs/celeriant-protocol.md sections 2.3 and 4.2). Rules the server
// itself enforces (empty Writes 9002, empty events 2000, type 0 2001) are left to the
// server so their codes reach the caller. Errors wrap ErrNotSent and ErrInvalidRequest.
func CheckWrite(req *WriteRequest) error {
	if req.ClientID == uuid.Nil {
		return invalidf("write: ClientID is required")
	}
	for i := range req.Writes {
		for j, ev := range req.Writes[i].Events {
			if n := len(ev.IV); n != 0 && n != wire.IVSize {
				return invalidf("write: aggregate %s event %d: IV of %d bytes, want %d or none", req.Writes[i].Key, j, n, wire.IVSize)
			}
		}
	}
	for i := range req.Writes {
		for j := i + 1; j < len(req.Writes); j++ {
			if req.Writes[i].Key == req.Writes[j].Key {
				return invalidf("write: aggregate %s appears twice", req.Writes[i].Key)
			}
		}
	}
	return nil
}

// CheckRead applies the client-side rules of a read: FromVersion 0 becomes 1 (as the
// official clients do, docs/celeriant-protocol.md section 4.5) and the encoded request must fit the
// 1007-byte fixed-size limit (section 2.2), counted with a correlation id since the TCP
// client adds one when CorrelationID is uuid.Nil. It returns the request to send; errors
// wrap ErrNotSent and ErrInvalidRequest.
func CheckRead(req ReadRequest) (ReadRequest, error) {
	if req.Filters.FromVersion == 0 {
		req.Filters.FromVersion = 1
	}
	if n := readRequestSize(&req); n > wire.MaxFixedBody {
		return req, invalidf("read: encoded request is %d bytes, over the %d-byte limit of a fixed-size message (too many EventTypes?)", n, wire.MaxFixedBody)
	}
	return req, nil
}

func uintSize(v uint64) int {
	switch {
	case v <= 0x7f:
		return 1
	case v <= 0xff:
		return 2
	case v <= 0xffff:
		return 3
	case v <= 0xffffffff:
		return 5
	}
	return 9
}

func optUSize(p *uint64) int {
	if p == nil {
		return 1
	}
	return uintSize(*p)
}

func optIDSize(u uuid.UUID) int {
	if u == uuid.Nil {
		return 1
	}
	return 18
}

func arrSize(n int) int {
	switch {
	case n < 16:
		return 1
	case n <= 0xffff:
		return 3
	}
	return 5
}

// readRequestSize is the body size Encoder.ReadRequest produces for req once it carries
// a correlation id.
func readRequestSize(req *ReadRequest) int {
	f := &req.Filters
	n := 1 + 18 + 1 + 3*18 + 1 // the correlation id is always sent (Client picks one)
	n += uintSize(f.FromVersion) + optUSize(f.ToVersion)
	if len(f.EventTypes) == 0 {
		n++
	} else {
		n += arrSize(len(f.EventTypes))
		for _, t := range f.EventTypes {
			n += uintSize(t)
		}
	}
	n += optIDSize(f.ExcludeClientID) + optIDSize(f.IncludeClientID) + optIDSize(f.ExcludeUserID) + optIDSize(f.IncludeUserID)
	for _, p := range []*uint64{f.MinServerTimestamp, f.MaxServerTimestamp, f.MinClientSeq, f.MaxClientSeq,
		f.MinEventTimestamp, f.MaxEventTimestamp, f.MinEventSeq, f.MaxEventSeq} {
		n += optUSize(p)
	}
	return n
}
