package wire

import (
	"encoding/binary"
	"io"
	"slices"
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
