package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/google/uuid"
)

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
