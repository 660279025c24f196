package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/google/uuid"
)

// Frame constants (docs/celeriant-protocol.md sections 2.1 and 2.2).
const (
	// HeaderSize is the size of the frame header: version, message type, compressed and
	// uncompressed body length (u32 little-endian each) and the compression byte.
	HeaderSize = 17
	// ProtocolVersion is the body codec this package speaks: 3 = MessagePack.
	ProtocolVersion = 3
	// MaxFixedBody is the largest body of a fixed-size message (1024 - 17 bytes);
	// fixed-size messages are also never compressed.
	MaxFixedBody = 1007
	// DefaultMaxRequestSize is the server's default --max-request-size (16 MiB).
	DefaultMaxRequestSize = 16 << 20
	// DefaultMaxResponseSize is the server's default --max-response-size (64 MiB).
	DefaultMaxResponseSize = 64 << 20
)

// MessageType is the frame header's message type (docs/celeriant-protocol.md section 4.1). Request and
// response ids overlap: request 6 is Watch, response 6 is ProtocolError.
type MessageType uint32

// Request message types (docs/celeriant-protocol.md section 4.1); the comment gives the size class of
// section 2.2 (fixed-size: uncompressed, at most MaxFixedBody bytes).
const (
	ReqAggregateDetails MessageType = 1  // fixed
	ReqRead             MessageType = 2  // fixed
	ReqWrite            MessageType = 3  // variable; may be compressed
	ReqTrimStart        MessageType = 4  // fixed
	ReqDelete           MessageType = 5  // fixed
	ReqWatch            MessageType = 6  // fixed
	ReqListOrgs         MessageType = 7  // fixed
	ReqListTypes        MessageType = 8  // fixed
	ReqListAggregates   MessageType = 9  // fixed
	ReqRegisterSchema   MessageType = 10 // variable; may be compressed
	ReqIdentify         MessageType = 14 // fixed
)

// Response message types (docs/celeriant-protocol.md section 4.1), with their size class (section 2.2).
// Any request may be answered with RespError.
const (
	RespAggregateDetails MessageType = 1  // fixed
	RespRead             MessageType = 2  // variable
	RespWrite            MessageType = 3  // fixed
	RespTrimStart        MessageType = 4  // fixed
	RespDelete           MessageType = 5  // fixed
	RespProtocolError    MessageType = 6  // fixed; never sent on the client port
	RespError            MessageType = 7  // fixed; ErrorResponse, decoded into *ServerError
	RespWatch            MessageType = 8  // variable
	RespListOrgs         MessageType = 9  // variable
	RespListTypes        MessageType = 10 // variable
	RespListAggregates   MessageType = 11 // variable
	RespRegisterSchema   MessageType = 12 // fixed
	RespIdentify         MessageType = 16 // variable; never compressed
)

// Header is a decoded frame header (docs/celeriant-protocol.md section 2.1).
type Header struct {
	Version            uint32      // body codec: 2 bincode, 3 MessagePack (ProtocolVersion)
	Type               MessageType // a Req* or Resp* id, depending on the direction
	CompressedLength   uint32      // body bytes on the wire
	UncompressedLength uint32      // body bytes after decompression
	Compression        uint8       // 0 none, 1 zstd with the cluster dictionary
}

// AppendHeader appends the 17 header bytes of h to dst.
func AppendHeader(dst []byte, h Header) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, h.Version)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.Type))
	dst = binary.LittleEndian.AppendUint32(dst, h.CompressedLength)
	dst = binary.LittleEndian.AppendUint32(dst, h.UncompressedLength)
	return append(dst, h.Compression)
}

// ParseHeader decodes the first 17 bytes of b (u32 fields little-endian). It checks the
// length only (else an error wrapping ErrProtocol); use CheckRequest or CheckResponse
// for the server's rules.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, errProtocolf("frame header: %d bytes, want %d", len(b), HeaderSize)
	}
	return Header{
		Version:            binary.LittleEndian.Uint32(b[0:4]),
		Type:               MessageType(binary.LittleEndian.Uint32(b[4:8])),
		CompressedLength:   binary.LittleEndian.Uint32(b[8:12]),
		UncompressedLength: binary.LittleEndian.Uint32(b[12:16]),
		Compression:        b[16],
	}, nil
}

func (h Header) checkCommon(maxSize uint32) error {
	if h.Version != 2 && h.Version != 3 {
		return errProtocolf("frame header: version %d (want 2 or 3)", h.Version)
	}
	if h.Compression > 1 {
		return errProtocolf("frame header: compression %d (want 0 or 1)", h.Compression)
	}
	if h.CompressedLength > maxSize || h.UncompressedLength > maxSize {
		return errProtocolf("frame header: body length %d/%d over the limit %d", h.CompressedLength, h.UncompressedLength, maxSize)
	}
	if h.Compression == 0 && h.CompressedLength != h.UncompressedLength {
		return errProtocolf("frame header: uncompressed body with lengths %d != %d", h.CompressedLength, h.UncompressedLength)
	}
	return nil
}

func (h Header) checkFixed(fixed bool) error {
	if fixed && (h.Compression != 0 || h.UncompressedLength > MaxFixedBody) {
		return errProtocolf("frame header: fixed-size message type %d with %d bytes, compression %d (limit %d, uncompressed)", h.Type, h.UncompressedLength, h.Compression, MaxFixedBody)
	}
	return nil
}

// CheckRequest applies the server's header rules to a request (docs/celeriant-protocol.md sections
// 2.1-2.2): version 2 or 3, compression 0 or 1, both lengths <= maxSize and equal when
// uncompressed, a known request type, fixed-size types uncompressed and <= 1007 bytes.
// A broken rule is an error wrapping ErrProtocol.
func (h Header) CheckRequest(maxSize uint32) error {
	if err := h.checkCommon(maxSize); err != nil {
		return err
	}
	switch h.Type {
	case ReqWrite, ReqRegisterSchema:
		return nil
	case ReqAggregateDetails, ReqRead, ReqTrimStart, ReqDelete, ReqWatch, ReqListOrgs, ReqListTypes, ReqListAggregates, ReqIdentify:
		return h.checkFixed(true)
	}
	return errProtocolf("frame header: unknown request type %d", h.Type)
}

// CheckResponse applies the same rules to a response (fixed-size: AggregateDetails,
// Write, TrimStart, Delete, ProtocolError, Error, RegisterSchema). Errors wrap ErrProtocol.
func (h Header) CheckResponse(maxSize uint32) error {
	if err := h.checkCommon(maxSize); err != nil {
		return err
	}
	switch h.Type {
	case RespRead, RespWatch, RespListOrgs, RespListTypes, RespListAggregates, RespIdentify:
		return nil
	case RespAggregateDetails, RespWrite, RespTrimStart, RespDelete, RespProtocolError, RespError, RespRegisterSchema:
		return h.checkFixed(true)
	}
	return errProtocolf("frame header: unknown response type %d", h.Type)
}

// ReadFrame reads one frame from r: the header, check(header), then the body into buf
// (grown as needed). The body aliases buf. A compressed body is returned as is
// (Header.Compression says so); this package never asks for compression. Errors: r's
// (io.EOF before any header byte, io.ErrUnexpectedEOF for a short frame) or check's.
func ReadFrame(r io.Reader, buf []byte, check func(Header) error) (Header, []byte, error) {
	var hb [HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return Header{}, buf, err
	}
	h, _ := ParseHeader(hb[:])
	if err := check(h); err != nil {
		return h, buf, err
	}
	buf, err := readBody(r, buf, int(h.CompressedLength))
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return h, buf, err
}

// readStep is the first step of readBody: memory for a body grows with the bytes that
// actually arrive, so a peer that declares 16 MiB and sends nothing costs 64 KiB, not
// 16 MiB per connection.
const readStep = 64 << 10

// readBody reads n bytes into buf (reused when it is large enough), growing it in
// doubling steps.
func readBody(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) >= n {
		buf = buf[:n]
		_, err := io.ReadFull(r, buf)
		return buf, err
	}
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), max(readStep, len(buf)))
		buf = slices.Grow(buf, step)
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

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

// Decoder decodes message bodies (docs/celeriant-protocol.md sections 3.2 and 4). Integers may use any
// width whose value fits (negative values are refused); ids must be bin8 of 16 bytes or
// an integer up to 64 bits; bin16/bin32 ids are refused, like the server. Request
// decoders are as strict as the server about array lengths (an event may have 7 or 8
// elements); response decoders accept and skip extra trailing elements. Every error
// wraps ErrProtocol. Not safe for concurrent use.
type Decoder struct {
	r bytes.Reader
	// arena is a private copy of the body being decoded; bin values are capped
	// sub-slices of it (one allocation per message instead of one per event).
	arena []byte
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{}
}

// reset starts decoding body.
func (x *Decoder) reset(body []byte, withArena bool) {
	x.arena = nil
	if withArena {
		x.arena = bytes.Clone(body)
		body = x.arena
	}
	x.r.Reset(body)
}

func wrapDecode(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: decode %s: %w", ErrProtocol, what, err)
}

// arr reads an array header and checks min <= n <= max (max < 0: no maximum). It returns
// the number of extra elements the caller must skip.
// arrayLen reads an array header; nil gives -1.
func (x *Decoder) arrayLen() (int, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	switch {
	case c >= fmtFixarray && c <= fmtFixarrayMax:
		return int(c & 0x0f), nil
	case c == fmtArray16:
		v, err := x.be(2)
		return int(v), err
	case c == fmtArray32:
		v, err := x.be(4)
		return int(v), err
	case c == fmtNil:
		return -1, nil
	}
	return 0, fmt.Errorf("code %#x where an array is required", c)
}

// mapLen reads a map header (nil is refused).
func (x *Decoder) mapLen() (int, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	switch {
	case c >= fmtFixmap && c <= fmtFixmapMax:
		return int(c & 0x0f), nil
	case c == fmtMap16:
		v, err := x.be(2)
		return int(v), err
	case c == fmtMap32:
		v, err := x.be(4)
		return int(v), err
	}
	return 0, fmt.Errorf("code %#x where a map is required", c)
}

// str reads a str value (fixstr, str8, str16 or str32) whose bytes are all present.
func (x *Decoder) str() (string, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return "", io.ErrUnexpectedEOF
	}
	var n uint64
	switch {
	case c >= fmtFixstr && c <= fmtFixstrMax:
		n = uint64(c & 0x1f)
	case c == fmtStr8, c == fmtStr16, c == fmtStr32:
		if n, err = x.be(1 << (c - fmtStr8)); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("code %#x where str is required", c)
	}
	if n > uint64(x.r.Len()) {
		return "", fmt.Errorf("str of %d bytes in %d", n, x.r.Len())
	}
	b := make([]byte, n)
	_, _ = x.r.Read(b)
	return string(b), nil
}

func (x *Decoder) arr(min, max int) (n int, err error) {
	n, err = x.arrayLen()
	if err != nil {
		return 0, err
	}
	if n < min || (max >= 0 && n > max) {
		return 0, fmt.Errorf("array of %d elements, want %d..%d", n, min, max)
	}
	return n, nil
}

// IVSize is the length of an Event.IV when present: an AES-GCM nonce.
const IVSize = 12

// Smallest encodings of the list elements, used to refuse element counts the unread
// bytes cannot hold: a 7-element event of one-byte fields and an empty bin (9 bytes), a
// batch with an integer client id and no events (6), a writes map entry with integer
// ids and no events (9).
const (
	minEventSize = 9
	minBatchSize = 6
	minEntrySize = 9
	// maxPrealloc caps the elements allocated ahead of decoding them: memory then
	// follows the elements actually decoded, not a peer's declared count.
	maxPrealloc = 1024
)

// list reads the header of a variable-length array of elements of at least minSize
// bytes each and bounds the count by the unread bytes.
func (x *Decoder) list(minSize int) (int, error) {
	n, err := x.arrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("nil where an array is required")
	}
	if n > x.r.Len()/minSize {
		return 0, fmt.Errorf("array of %d elements in %d bytes", n, x.r.Len())
	}
	return n, nil
}

// skip skips n values. It is iterative (a peer may nest arrays millions deep; a
// recursive skip would overflow the stack, a fatal error) and checks every declared
// length against the unread bytes.
func (x *Decoder) skip(n int) error {
	pending := uint64(max(n, 0))
	for pending > 0 {
		if pending > uint64(x.r.Len()) { // every value takes at least one byte
			return io.ErrUnexpectedEOF
		}
		pending--
		c, _ := x.r.ReadByte()
		var (
			data uint64 // payload bytes to skip
			err  error
		)
		switch {
		case c <= fmtPosFixintMax || c >= fmtNegFixint || c == fmtNil || c == fmtFalse || c == fmtTrue:
		case c <= fmtFixmapMax:
			pending += 2 * uint64(c&0x0f)
		case c <= fmtFixarrayMax:
			pending += uint64(c & 0x0f)
		case c <= fmtFixstrMax:
			data = uint64(c & 0x1f)
		case c == fmtBin8 || c == fmtStr8:
			data, err = x.be(1)
		case c == fmtBin16 || c == fmtStr16:
			data, err = x.be(2)
		case c == fmtBin32 || c == fmtStr32:
			data, err = x.be(4)
		case c >= fmtExt8 && c <= fmtExt32: // length, then a type byte
			data, err = x.be(1 << (c - fmtExt8))
			data++
		case c == fmtFloat32:
			data = 4
		case c == fmtFloat64:
			data = 8
		case c >= fmtUint8 && c <= fmtUint64:
			data = 1 << (c - fmtUint8)
		case c >= fmtInt8 && c <= fmtInt64:
			data = 1 << (c - fmtInt8)
		case c >= fmtFixext1 && c <= fmtFixext16: // a type byte and 1..16 data bytes
			data = 1 + 1<<(c-fmtFixext1)
		case c == fmtArray16 || c == fmtArray32:
			var m uint64
			m, err = x.be(2 << (c - fmtArray16))
			pending += m
		case c == fmtMap16 || c == fmtMap32:
			var m uint64
			m, err = x.be(2 << (c - fmtMap16))
			pending += 2 * m
		default:
			return fmt.Errorf("code %#x is not MessagePack", c)
		}
		if err != nil {
			return err
		}
		if data > uint64(x.r.Len()) {
			return io.ErrUnexpectedEOF
		}
		_, _ = x.r.Seek(int64(data), io.SeekCurrent)
	}
	return nil
}

// The scalar readers below read x.r directly (concrete calls, no interface dispatch).

func (x *Decoder) peek() (byte, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	_ = x.r.UnreadByte()
	return c, nil
}

func (x *Decoder) isNil() (bool, error) {
	c, err := x.peek()
	if err != nil {
		return false, err
	}
	if c == fmtNil {
		_, _ = x.r.ReadByte()
		return true, nil
	}
	return false, nil
}

// be reads an n-byte big-endian unsigned value (n <= 8).
func (x *Decoder) be(n int) (uint64, error) {
	var b [8]byte
	if m, _ := x.r.Read(b[8-n:]); m != n {
		return 0, io.ErrUnexpectedEOF
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// u reads any MessagePack integer whose value is not negative.
func (x *Decoder) u() (uint64, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	switch {
	case c <= fmtPosFixintMax:
		return uint64(c), nil
	case c >= fmtUint8 && c <= fmtUint64:
		return x.be(1 << (c - fmtUint8))
	case c >= fmtInt8 && c <= fmtInt64:
		n := 1 << (c - fmtInt8)
		v, err := x.be(n)
		if err != nil {
			return 0, err
		}
		if v>>(8*n-1)&1 == 1 {
			return 0, fmt.Errorf("negative integer where unsigned is required")
		}
		return v, nil
	case c >= fmtNegFixint:
		return 0, fmt.Errorf("negative integer where unsigned is required")
	}
	return 0, fmt.Errorf("code %#x where an unsigned integer is required", c)
}

func (x *Decoder) optU() (*uint64, error) {
	if n, err := x.isNil(); n || err != nil {
		return nil, err
	}
	v, err := x.u()
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func (x *Decoder) bool() (bool, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return false, io.ErrUnexpectedEOF
	}
	switch c {
	case fmtFalse:
		return false, nil
	case fmtTrue:
		return true, nil
	}
	return false, fmt.Errorf("code %#x where a bool is required", c)
}

func (x *Decoder) id() (uuid.UUID, error) {
	var u uuid.UUID
	c, err := x.peek()
	if err != nil {
		return u, err
	}
	if c == fmtBin8 {
		_, _ = x.r.ReadByte()
		n, err := x.be(1)
		if err != nil {
			return u, err
		}
		if n != 16 {
			return u, fmt.Errorf("128-bit id of %d bytes, want 16", n)
		}
		if m, _ := x.r.Read(u[:]); m != 16 { // concrete call: u stays on the stack
			return u, io.ErrUnexpectedEOF
		}
		return u, nil
	}
	v, err := x.u()
	if err != nil {
		return u, fmt.Errorf("128-bit id: %w", err)
	}
	binary.BigEndian.PutUint64(u[8:], v)
	return u, nil
}

func (x *Decoder) optID() (uuid.UUID, error) {
	if n, err := x.isNil(); n || err != nil {
		return uuid.Nil, err
	}
	return x.id()
}

func (x *Decoder) bin() ([]byte, error) {
	c, err := x.peek()
	if err != nil {
		return nil, err
	}
	if c != fmtBin8 && c != fmtBin16 && c != fmtBin32 {
		return nil, fmt.Errorf("code %#x where bin is required", c)
	}
	_, _ = x.r.ReadByte()
	v, err := x.be(1 << (c - fmtBin8)) // 1, 2 or 4 length bytes
	if err != nil {
		return nil, err
	}
	n := int(v)
	if n > x.r.Len() {
		return nil, fmt.Errorf("bin of %d bytes in %d", n, x.r.Len())
	}
	if x.arena != nil {
		off := len(x.arena) - x.r.Len()
		_, _ = x.r.Seek(int64(n), io.SeekCurrent)
		return x.arena[off : off+n : off+n], nil
	}
	b := make([]byte, n)
	_, _ = x.r.Read(b)
	return b, nil
}

func (x *Decoder) key() (k AggregateKey, err error) {
	if _, err = x.arr(3, 3); err != nil {
		return k, err
	}
	if k.Org, err = x.id(); err != nil {
		return k, err
	}
	if k.Type, err = x.id(); err != nil {
		return k, err
	}
	k.ID, err = x.id()
	return k, err
}

func (x *Decoder) event(ev *Event, strict bool) (err error) {
	max := 8
	if !strict {
		max = -1
	}
	n, err := x.arr(7, max)
	if err != nil {
		return err
	}
	if ev.ClientSeq, err = x.u(); err != nil {
		return err
	}
	if ev.EventSeq, err = x.u(); err != nil {
		return err
	}
	if ev.EventID, err = x.optID(); err != nil {
		return err
	}
	if ev.Timestamp, err = x.u(); err != nil {
		return err
	}
	if ev.TypeMajor, err = x.u(); err != nil {
		return err
	}
	if ev.TypeMinor, err = x.u(); err != nil {
		return err
	}
	if ev.Value, err = x.bin(); err != nil {
		return err
	}
	ev.IV = nil
	if n >= 8 {
		isNil, err := x.isNil()
		if err != nil {
			return err
		}
		if !isNil {
			if ev.IV, err = x.bin(); err != nil {
				return err
			}
			// The server reads and writes the iv as Option<[u8; 12]>: nil or exactly 12
			// bytes, another length (an empty bin too) is malformed in both directions.
			if len(ev.IV) != IVSize {
				return fmt.Errorf("iv of %d bytes, want %d", len(ev.IV), IVSize)
			}
		}
	}
	return x.skip(n - 8)
}

func (x *Decoder) events(strict bool) ([]Event, error) {
	n, err := x.list(minEventSize)
	if err != nil {
		return nil, err
	}
	evs := make([]Event, 0, min(n, maxPrealloc))
	for range n {
		evs = append(evs, Event{})
		if err := x.event(&evs[len(evs)-1], strict); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// WriteRequest decodes a Write request body. Duplicate aggregate keys collapse, the
// last entry winning, as in the server's HashMap.
func (x *Decoder) WriteRequest(body []byte) (req WriteRequest, err error) {
	x.reset(body, true)
	err = func() error {
		if _, err := x.arr(4, 4); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.ClientID, err = x.id(); err != nil {
			return err
		}
		if req.UserID, err = x.optID(); err != nil {
			return err
		}
		n, err := x.mapLen()
		if err != nil {
			return err
		}
		if n < 0 || n > x.r.Len()/minEntrySize {
			return fmt.Errorf("writes map of %d entries in %d bytes", n, x.r.Len())
		}
		req.Writes = make([]AggregateWrite, 0, min(n, maxPrealloc))
		// Duplicate keys are found with an index past a few entries: a linear scan per
		// entry would let one 16 MiB request cost hours of CPU.
		var index map[AggregateKey]int
		if n > 8 {
			index = make(map[AggregateKey]int, min(n, maxPrealloc))
		}
		for i := 0; i < n; i++ {
			var w AggregateWrite
			if w.Key, err = x.key(); err != nil {
				return err
			}
			if _, err := x.arr(4, 4); err != nil {
				return err
			}
			if w.Events, err = x.events(true); err != nil {
				return err
			}
			if w.AllowCreate, err = x.bool(); err != nil {
				return err
			}
			if w.ExpectedVersion, err = x.optU(); err != nil {
				return err
			}
			if w.EnforceClientIdempotency, err = x.bool(); err != nil {
				return err
			}
			j, dup := -1, false
			if index != nil {
				j, dup = index[w.Key]
			} else {
				j = slices.IndexFunc(req.Writes, func(o AggregateWrite) bool { return o.Key == w.Key })
				dup = j >= 0
			}
			if dup {
				req.Writes[j] = w
				continue
			}
			if index != nil {
				index[w.Key] = len(req.Writes)
			}
			req.Writes = append(req.Writes, w)
		}
		return nil
	}()
	return req, wrapDecode("write request", err)
}

// ReadRequest decodes a Read request body.
func (x *Decoder) ReadRequest(body []byte) (req ReadRequest, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(3, 3); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.Key, err = x.key(); err != nil {
			return err
		}
		if _, err := x.arr(15, 15); err != nil {
			return err
		}
		f := &req.Filters
		if f.FromVersion, err = x.u(); err != nil {
			return err
		}
		if f.ToVersion, err = x.optU(); err != nil {
			return err
		}
		if isNil, err := x.isNil(); err != nil {
			return err
		} else if !isNil {
			n, err := x.list(1)
			if err != nil {
				return err
			}
			f.EventTypes = make([]uint64, n)
			for i := range f.EventTypes {
				if f.EventTypes[i], err = x.u(); err != nil {
					return err
				}
			}
		}
		for _, p := range []*uuid.UUID{&f.ExcludeClientID, &f.IncludeClientID, &f.ExcludeUserID, &f.IncludeUserID} {
			if *p, err = x.optID(); err != nil {
				return err
			}
		}
		for _, p := range []**uint64{&f.MinServerTimestamp, &f.MaxServerTimestamp, &f.MinClientSeq, &f.MaxClientSeq,
			&f.MinEventTimestamp, &f.MaxEventTimestamp, &f.MinEventSeq, &f.MaxEventSeq} {
			if *p, err = x.optU(); err != nil {
				return err
			}
		}
		return nil
	}()
	return req, wrapDecode("read request", err)
}

// AggregateDetailsRequest decodes an AggregateDetails request body.
func (x *Decoder) AggregateDetailsRequest(body []byte) (correlationID uuid.UUID, key AggregateKey, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(2, 2); err != nil {
			return err
		}
		if correlationID, err = x.optID(); err != nil {
			return err
		}
		key, err = x.key()
		return err
	}()
	return correlationID, key, wrapDecode("aggregate details request", err)
}

// WriteResponse decodes a WriteResponse body (a nil version becomes 0).
func (x *Decoder) WriteResponse(body []byte) (res WriteResult, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(2, -1)
		if err != nil {
			return err
		}
		if res.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		v, err := x.optU()
		if err != nil {
			return err
		}
		if v != nil {
			res.Version = *v
		}
		return x.skip(n - 2)
	}()
	return res, wrapDecode("write response", err)
}

// ReadResponse decodes a ReadResponse body (a nil next version becomes 0).
func (x *Decoder) ReadResponse(body []byte) (res ReadResult, err error) {
	x.reset(body, true)
	err = func() error {
		n, err := x.arr(3, -1)
		if err != nil {
			return err
		}
		if res.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		nb, err := x.list(minBatchSize)
		if err != nil {
			return err
		}
		res.Batches = make([]Batch, 0, min(nb, maxPrealloc))
		for range nb {
			res.Batches = append(res.Batches, Batch{})
			b := &res.Batches[len(res.Batches)-1]
			m, err := x.arr(5, -1)
			if err != nil {
				return err
			}
			if b.Version, err = x.u(); err != nil {
				return err
			}
			if b.ClientID, err = x.id(); err != nil {
				return err
			}
			if b.UserID, err = x.optID(); err != nil {
				return err
			}
			if b.ServerTimestamp, err = x.u(); err != nil {
				return err
			}
			if b.Events, err = x.events(false); err != nil {
				return err
			}
			if err := x.skip(m - 5); err != nil {
				return err
			}
		}
		v, err := x.optU()
		if err != nil {
			return err
		}
		if v != nil {
			res.NextVersion = *v
		}
		return x.skip(n - 3)
	}()
	return res, wrapDecode("read response", err)
}

// AggregateDetailsResponse decodes an AggregateDetailsResponse body.
func (x *Decoder) AggregateDetailsResponse(body []byte) (d AggregateDetails, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(10, -1)
		if err != nil {
			return err
		}
		if d.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		for _, p := range []*uint64{&d.MinVersion, &d.MaxVersion, &d.MaxEventSeq} {
			if *p, err = x.u(); err != nil {
				return err
			}
		}
		for _, p := range []*bool{&d.IsDeleted, &d.AllowRecreate, &d.AllowSequenceContinuation} {
			if *p, err = x.bool(); err != nil {
				return err
			}
		}
		if d.LastServerTimestamp, err = x.u(); err != nil {
			return err
		}
		if d.LastClientID, err = x.id(); err != nil {
			return err
		}
		if d.LastUserID, err = x.optID(); err != nil {
			return err
		}
		return x.skip(n - 10)
	}()
	return d, wrapDecode("aggregate details response", err)
}

// ErrorFrame is a decoded ErrorResponse (docs/celeriant-protocol.md section 4.8); package
// celeriant turns it into a *ServerError.
type ErrorFrame struct {
	CorrelationID uuid.UUID // uuid.Nil when absent
	Code          uint32    // the server's error_code
	Message       string    // the server's text, usually a small JSON object
}

// ErrorResponse decodes an ErrorResponse body.
func (x *Decoder) ErrorResponse(body []byte) (ErrorFrame, error) {
	x.reset(body, false)
	var (
		corr uuid.UUID
		code uint64
		msg  string
	)
	err := func() (err error) {
		n, err := x.arr(3, -1)
		if err != nil {
			return err
		}
		if corr, err = x.optID(); err != nil {
			return err
		}
		if code, err = x.u(); err != nil {
			return err
		}
		if code > 0xffffffff {
			return fmt.Errorf("error code %d over u32", code)
		}
		if msg, err = x.str(); err != nil {
			return err
		}
		return x.skip(n - 3)
	}()
	if err != nil {
		return ErrorFrame{}, wrapDecode("error response", err)
	}
	return ErrorFrame{CorrelationID: corr, Code: uint32(code), Message: msg}, nil
}
