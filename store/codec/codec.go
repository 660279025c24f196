// Package codec holds the encodings that more than one store keeps on its
// server: the binary form of a stored response's headers and the rounding of
// durations to whole milliseconds, and (DecodeResponse, Answer) the checks and
// the claim's answer from a stored record that the SQL stores share.
// store/postgres, store/mysql and store/redis (separate modules) use it, so a
// record's headers and deadlines mean the same on every backend. It is public so that no module reaches into another's internal
// packages; the header layout is versioned by its first byte (Format), and a
// change of layout is a new Format value that DecodeHeader keeps reading (see
// docs/architecture.md).
package codec

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Millis is d in whole milliseconds, rounded up: a positive duration never
// becomes 0 and a lease or retention is never shorter than asked. It does not
// overflow: math.MaxInt64 (about 292 years) gives 9223372036855; a negative d
// gives its value truncated toward zero.
func Millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

// Format is the first byte of an encoded header set, so a later version can
// change the layout and still read (or cleanly refuse) old rows.
const Format = 1

// EncodeHeader returns the compact binary form of h that the stores keep (the
// Postgres headers column, the Redis record's h field), or nil when h has no
// values:
//
//	format byte (1)
//	uvarint   number of names
//	per name: uvarint len, name bytes, uvarint number of values,
//	          per value: uvarint len, value bytes
//
// Names are written as given (the middleware passes canonical names); an
// empty name and a name without values are left out. Map order is
// not significant, so two encodings of the same set may differ byte for byte.
func EncodeHeader(h http.Header) []byte { return AppendHeader(nil, h) }

// AppendHeader appends EncodeHeader(h) to b (nothing when h has no values), so
// that a store building a larger value encodes the headers in place.
func AppendHeader(b []byte, h http.Header) []byte {
	size := headerSize(h)
	if size == 0 {
		return b
	}
	b = slices.Grow(b, size)
	n := 0
	for name, vals := range h {
		if kept(name, vals) {
			n++
		}
	}
	b = append(b, Format)
	b = binary.AppendUvarint(b, uint64(n))
	for name, vals := range h {
		if !kept(name, vals) {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// kept reports whether the encoding keeps the header name with vals: a name
// with no values says nothing, and net/http never sends an empty name (it
// drops invalid names when it writes a response), so a replay keeps neither.
func kept(name string, vals []string) bool { return name != "" && len(vals) > 0 }

// headerSize bounds the size of h's encoding: 0 when h has no values.
func headerSize(h http.Header) int {
	size := 0
	for name, vals := range h {
		if !kept(name, vals) {
			continue
		}
		size += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range vals {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	if size == 0 {
		return 0
	}
	return size + 1 + binary.MaxVarintLen64
}

// DecodeHeader parses the output of EncodeHeader. "" gives a nil Header. Any
// malformed input (unknown format, truncated, trailing bytes, counts larger than
// the input could hold, an empty name, a name without values) wraps
// store.ErrCorrupt; it never panics. The header's strings share all's memory, so
// a caller holding bytes converts them to one string once.
func DecodeHeader(all string) (http.Header, error) {
	if len(all) == 0 {
		return nil, nil
	}
	if all[0] != Format {
		return nil, fmt.Errorf("idemkey/store/codec: %w: headers: unknown format %d", store.ErrCorrupt, all[0])
	}
	d := headerDecoder{s: all, pos: 1}
	n := d.count()
	h := make(http.Header, n)
	// The values of all names share one array (a name has at least one value,
	// so n is a lower bound), each name's slice capped at its own values so an
	// append to one never writes over the next.
	backing := make([]string, 0, n)
	for range n {
		name := d.str()
		m := d.count()
		if d.err != nil {
			break
		}
		var vals []string
		if i := len(backing); i+m <= cap(backing) {
			backing = backing[:i+m]
			vals = backing[i : i+m : i+m]
		} else {
			vals = make([]string, m)
		}
		for j := range vals {
			vals[j] = d.str()
		}
		switch {
		case d.err != nil:
		case name == "":
			d.fail("empty header name")
		case m == 0:
			d.fail("header name without values")
		}
		if d.err != nil {
			break
		}
		h[name] = vals
	}
	if d.err == nil && d.pos != len(all) {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	return h, nil
}

type headerDecoder struct {
	s   string
	pos int
	err error
}

func (d *headerDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("idemkey/store/codec: %w: headers: %s at byte %d", store.ErrCorrupt, what, d.pos)
	}
}

func (d *headerDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.pos >= len(d.s) {
			d.fail("truncated length")
			return 0
		}
		c := d.s[d.pos]
		d.pos++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	d.fail("length overflows")
	return 0
}

// count reads a number of items, each of which takes at least one more byte.
func (d *headerDecoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.s)-d.pos) {
		d.fail("count larger than the data")
		return 0
	}
	return int(v)
}

func (d *headerDecoder) str() string {
	v := d.uvarint()
	if d.err != nil {
		return ""
	}
	if v > uint64(len(d.s)-d.pos) {
		d.fail("string longer than the data")
		return ""
	}
	s := d.s[d.pos : d.pos+int(v)]
	d.pos += int(v)
	return s
}
