package wire

import (
	"encoding/binary"

	"github.com/google/uuid"
)

// MessagePack format bytes used by this codec (the MessagePack specification's
// format names; docs/celeriant-protocol.md section 3). The codec is entirely ours: the
// server's rmp-serde output has fixed shapes (positional arrays, minimal integer widths,
// bin for byte strings, 16-byte bin for 128-bit ids), a hostile peer must not be able to
// make it recurse or allocate ahead of the bytes it sent, and ids and bins are read in
// place, none of which a general-purpose MessagePack library offers together.
const (
	fmtPosFixintMax = 0x7f // 0x00-0x7f: positive fixint
	fmtFixmap       = 0x80 // 0x80-0x8f: fixmap, low 4 bits = entries
	fmtFixmapMax    = 0x8f
	fmtFixarray     = 0x90 // 0x90-0x9f: fixarray, low 4 bits = elements
	fmtFixarrayMax  = 0x9f
	fmtFixstr       = 0xa0 // 0xa0-0xbf: fixstr, low 5 bits = bytes
	fmtFixstrMax    = 0xbf
	fmtNil          = 0xc0
	fmtNeverUsed    = 0xc1
	fmtFalse        = 0xc2
	fmtTrue         = 0xc3
	fmtBin8         = 0xc4
	fmtBin16        = 0xc5
	fmtBin32        = 0xc6
	fmtExt8         = 0xc7
	fmtExt16        = 0xc8
	fmtExt32        = 0xc9
	fmtFloat32      = 0xca
	fmtFloat64      = 0xcb
	fmtUint8        = 0xcc
	fmtUint16       = 0xcd
	fmtUint32       = 0xce
	fmtUint64       = 0xcf
	fmtInt8         = 0xd0
	fmtInt16        = 0xd1
	fmtInt32        = 0xd2
	fmtInt64        = 0xd3
	fmtFixext1      = 0xd4 // 0xd4-0xd8: fixext 1, 2, 4, 8, 16
	fmtFixext16     = 0xd8
	fmtStr8         = 0xd9
	fmtStr16        = 0xda
	fmtStr32        = 0xdb
	fmtArray16      = 0xdc
	fmtArray32      = 0xdd
	fmtMap16        = 0xde
	fmtMap32        = 0xdf
	fmtNegFixint    = 0xe0 // 0xe0-0xff: negative fixint
)

// Encoder builds whole frames (header and MessagePack body, docs/celeriant-protocol.md
// sections 2-4) with the minimal integer and length widths rmp-serde produces. It
// reuses one buffer: the returned frame is valid until the next call. Not safe for
// concurrent use.
type Encoder struct {
	b []byte
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder { return &Encoder{} }

var zeroHeader [HeaderSize]byte

func (e *Encoder) begin() { e.b = append(e.b[:0], zeroHeader[:]...) }

func (e *Encoder) finish(t MessageType) []byte {
	n := uint32(len(e.b) - HeaderSize)
	AppendHeader(e.b[:0], Header{Version: ProtocolVersion, Type: t, CompressedLength: n, UncompressedLength: n})
	return e.b
}

// length writes a container or byte-string header: the fix form (fix, when fixMax > 0
// and n fits in it), else the 8-bit (f8 != 0), 16-bit or 32-bit form.
func (e *Encoder) length(n int, fix, fixMax, f8, f16, f32 byte) {
	switch {
	case fixMax > 0 && n <= int(fixMax-fix):
		e.b = append(e.b, fix|byte(n))
	case f8 != 0 && n <= 0xff:
		e.b = append(e.b, f8, byte(n))
	case n <= 0xffff:
		e.b = append(e.b, f16)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, f32)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
}

func (e *Encoder) arr(n int)    { e.length(n, fmtFixarray, fmtFixarrayMax, 0, fmtArray16, fmtArray32) }
func (e *Encoder) mapLen(n int) { e.length(n, fmtFixmap, fmtFixmapMax, 0, fmtMap16, fmtMap32) }
func (e *Encoder) nil_()        { e.b = append(e.b, fmtNil) }

func (e *Encoder) bool(v bool) {
	if v {
		e.b = append(e.b, fmtTrue)
	} else {
		e.b = append(e.b, fmtFalse)
	}
}

// u writes v in the smallest unsigned form.
func (e *Encoder) u(v uint64) {
	switch {
	case v <= fmtPosFixintMax:
		e.b = append(e.b, byte(v))
	case v <= 0xff:
		e.b = append(e.b, fmtUint8, byte(v))
	case v <= 0xffff:
		e.b = append(e.b, fmtUint16)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(v))
	case v <= 0xffffffff:
		e.b = append(e.b, fmtUint32)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(v))
	default:
		e.b = append(e.b, fmtUint64)
		e.b = binary.BigEndian.AppendUint64(e.b, v)
	}
}

func (e *Encoder) bin(v []byte) {
	e.length(len(v), 0, 0, fmtBin8, fmtBin16, fmtBin32)
	e.b = append(e.b, v...)
}

func (e *Encoder) str(v string) {
	e.length(len(v), fmtFixstr, fmtFixstrMax, fmtStr8, fmtStr16, fmtStr32)
	e.b = append(e.b, v...)
}

// id writes a u128 as bin8 of 16 big-endian bytes (the UUID bytes as they are).
func (e *Encoder) id(v uuid.UUID) { e.bin(v[:]) }

func (e *Encoder) optID(v uuid.UUID) {
	if v == uuid.Nil {
		e.nil_()
		return
	}
	e.id(v)
}

func (e *Encoder) optU(p *uint64) {
	if p == nil {
		e.nil_()
		return
	}
	e.u(*p)
}

func (e *Encoder) key(k AggregateKey) {
	e.arr(3)
	e.id(k.Org)
	e.id(k.Type)
	e.id(k.ID)
}

// event writes the 8-element event. An empty IV is written as nil: on the wire an IV is
// absent or exactly 12 bytes (the server's Option<[u8; 12]>), never an empty bin.
func (e *Encoder) event(ev *Event) {
	e.arr(8)
	e.u(ev.ClientSeq)
	e.u(ev.EventSeq)
	e.optID(ev.EventID)
	e.u(ev.Timestamp)
	e.u(ev.TypeMajor)
	e.u(ev.TypeMinor)
	e.bin(ev.Value)
	if len(ev.IV) == 0 {
		e.nil_()
	} else {
		e.bin(ev.IV)
	}
}

// WriteRequest encodes a Write request frame (type 3, docs/celeriant-protocol.md section 4.3). The
// writes map is written in the order of req.Writes.
func (e *Encoder) WriteRequest(req *WriteRequest) []byte {
	e.begin()
	e.arr(4)
	e.optID(req.CorrelationID)
	e.id(req.ClientID)
	e.optID(req.UserID)
	e.mapLen(len(req.Writes))
	for i := range req.Writes {
		w := &req.Writes[i]
		e.key(w.Key)
		e.arr(4)
		e.arr(len(w.Events))
		for j := range w.Events {
			e.event(&w.Events[j])
		}
		e.bool(w.AllowCreate)
		e.optU(w.ExpectedVersion)
		e.bool(w.EnforceClientIdempotency)
	}
	return e.finish(ReqWrite)
}

// ReadRequest encodes a Read request frame (type 2, docs/celeriant-protocol.md section 4.5). FromVersion
// is sent as given (no clamping at this level). The caller checks the 1007-byte limit.
func (e *Encoder) ReadRequest(req *ReadRequest) []byte {
	e.begin()
	e.arr(3)
	e.optID(req.CorrelationID)
	e.key(req.Key)
	f := &req.Filters
	e.arr(15)
	e.u(f.FromVersion)
	e.optU(f.ToVersion)
	if len(f.EventTypes) == 0 {
		e.nil_()
	} else {
		e.arr(len(f.EventTypes))
		for _, t := range f.EventTypes {
			e.u(t)
		}
	}
	e.optID(f.ExcludeClientID)
	e.optID(f.IncludeClientID)
	e.optID(f.ExcludeUserID)
	e.optID(f.IncludeUserID)
	e.optU(f.MinServerTimestamp)
	e.optU(f.MaxServerTimestamp)
	e.optU(f.MinClientSeq)
	e.optU(f.MaxClientSeq)
	e.optU(f.MinEventTimestamp)
	e.optU(f.MaxEventTimestamp)
	e.optU(f.MinEventSeq)
	e.optU(f.MaxEventSeq)
	return e.finish(ReqRead)
}

// AggregateDetailsRequest encodes an AggregateDetails request frame (type 1, section 4.7).
func (e *Encoder) AggregateDetailsRequest(correlationID uuid.UUID, key AggregateKey) []byte {
	e.begin()
	e.arr(2)
	e.optID(correlationID)
	e.key(key)
	return e.finish(ReqAggregateDetails)
}

// WriteResponse encodes a WriteResponse frame (type 3, section 4.4); Version 0 is nil.
func (e *Encoder) WriteResponse(res *WriteResult) []byte {
	e.begin()
	e.arr(2)
	e.optID(res.CorrelationID)
	if res.Version == 0 {
		e.nil_()
	} else {
		e.u(res.Version)
	}
	return e.finish(RespWrite)
}

// ReadResponse encodes a ReadResponse frame (type 2, section 4.6); NextVersion 0 is nil.
func (e *Encoder) ReadResponse(res *ReadResult) []byte {
	e.begin()
	e.arr(3)
	e.optID(res.CorrelationID)
	e.arr(len(res.Batches))
	for i := range res.Batches {
		b := &res.Batches[i]
		e.arr(5)
		e.u(b.Version)
		e.id(b.ClientID)
		e.optID(b.UserID)
		e.u(b.ServerTimestamp)
		e.arr(len(b.Events))
		for j := range b.Events {
			e.event(&b.Events[j])
		}
	}
	if res.NextVersion == 0 {
		e.nil_()
	} else {
		e.u(res.NextVersion)
	}
	return e.finish(RespRead)
}

// AggregateDetailsResponse encodes an AggregateDetailsResponse frame (type 1, section 4.7).
func (e *Encoder) AggregateDetailsResponse(d *AggregateDetails) []byte {
	e.begin()
	e.arr(10)
	e.optID(d.CorrelationID)
	e.u(d.MinVersion)
	e.u(d.MaxVersion)
	e.u(d.MaxEventSeq)
	e.bool(d.IsDeleted)
	e.bool(d.AllowRecreate)
	e.bool(d.AllowSequenceContinuation)
	e.u(d.LastServerTimestamp)
	e.id(d.LastClientID)
	e.optID(d.LastUserID)
	return e.finish(RespAggregateDetails)
}

// ErrorResponse encodes an ErrorResponse frame (type 7, section 4.8).
func (e *Encoder) ErrorResponse(correlationID uuid.UUID, code uint32, message string) []byte {
	e.begin()
	e.arr(3)
	e.optID(correlationID)
	e.u(uint64(code))
	e.str(message)
	return e.finish(RespError)
}
