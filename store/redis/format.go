package redis

import (
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// The record format (format 2): one Redis string per (scope, key), holding either
// an in-flight marker or a completed record, so that a claim is one SET and a
// replay one read of one value. Integers are big-endian. Byte offsets (0-based):
//
//	marker (67 bytes, the key's TTL is the claim's retention):
//	  0      format, 2
//	  1      kind, 'p' (in flight)
//	  2      flags: bit 0 set once a duplicate waits for the claim (Wait); Complete
//	         and Release then PUBLISH the key, and only then
//	  3-34   fingerprint
//	  35-50  fencing token of the holder
//	  51-58  created at: Unix ms of the first claim, the claiming process's clock
//	  59-66  lease: ms from the lease's end to the key's expiry (int64)
//
//	record (97 bytes, then headers and body; the key's TTL is the retention):
//	  0      format, 2
//	  1      kind, 'c' (completed)
//	  2      flags: bit 0 set when the body was omitted
//	  3-58   fingerprint, token and created at, as in the marker it replaced
//	         (token zero when filled)
//	  59-74  nonce of the Complete call that wrote it (zero when filled)
//	  75-82  completed at, 83-90 expires at (Unix ms, the completing process's
//	         clock: completed at plus the retention)
//	  91-92  HTTP status (uint16)
//	  93-96  length of the headers (uint32)
//	  97-    headers (store/codec EncodeHeader), then the body as is
//
// Bytes 3-58 of a record are bytes 3-58 of the marker, so Complete's script
// copies them with one string.sub and appends what the application sent: it
// reads no clock and no expiry. A marker keeps its lease relative to the key's
// expiry because the claim that writes it is a plain SET NX PX from the
// application, which cannot read the server's clock: the key expires retention
// after the server ran the SET, so "lease" is the retention minus the lease, and
// the lease is live while the key's PTTL exceeds it. Scripts that move the
// expiry (Renew, a takeover) rewrite it. Leases and retention are enforced on
// the Redis server's clock only (key TTLs); the record's times are reported, not
// enforced, and are the application's clock, off by the skew between the
// application's hosts and Redis. Anything else under a record key is foreign
// data (store.ErrCorrupt).
const (
	formatVersion = 2
	kindMarker    = 'p'
	kindRecord    = 'c'
	markerLen     = 67
	recordHead    = 97
	flagWaited    = 1 // marker
	flagOmitted   = 1 // record
)

// marker is a decoded in-flight marker.
type marker struct {
	fp      store.Fingerprint
	token   store.Token
	created int64 // Unix ms, the claiming process's clock
	lease   int64 // ms before the key's expiry
}

// remaining is the marker's remaining lease given the key's PTTL (never beyond
// the key's life), as the scripts judge it. Computed in whole ms: an offset
// no claim writes (over maxTTL, from foreign or damaged bytes) overflowed as a
// Duration and made an ended lease look live for the key's whole life, while
// contend and wait (Lua) called it ended.
func (m *marker) remaining(pttl time.Duration) time.Duration {
	ms := pttl.Milliseconds()
	switch {
	case m.lease < 0:
		return pttl
	case m.lease >= ms:
		return 0
	}
	return min(millis(ms-m.lease), pttl)
}

// putMarker writes into b (markerLen bytes) a marker for a claim of fp by tok
// made at created (Unix ms), whose lease ends leaseEnd ms before the key expires.
func putMarker(b []byte, fp store.Fingerprint, tok store.Token, created, leaseEnd int64) {
	b[0], b[1], b[2] = formatVersion, kindMarker, 0
	copy(b[3:35], fp[:])
	copy(b[35:51], tok[:])
	put64(b[51:], created)
	put64(b[59:], leaseEnd)
}

// kindOf returns the kind of a stored value: kindMarker, kindRecord or 0 for
// foreign data.
func kindOf(v string) byte {
	switch {
	case len(v) == markerLen && v[0] == formatVersion && v[1] == kindMarker:
		return kindMarker
	case len(v) >= recordHead && v[0] == formatVersion && v[1] == kindRecord:
		return kindRecord
	}
	return 0
}

func decodeMarker(v string) (m marker) {
	copy(m.fp[:], v[3:35])
	copy(m.token[:], v[35:51])
	m.created, m.lease = get64(v, 51), get64(v, 59)
	return m
}

// recordFingerprint returns the fingerprint of a record (kindOf == kindRecord).
func recordFingerprint(v string) (fp store.Fingerprint) {
	copy(fp[:], v[3:35])
	return fp
}

// decodeRecord decodes a completed record (kindOf == kindRecord). The headers
// share v's memory; the body is copied once.
func decodeRecord(v string) (*store.Record, error) {
	status := int(v[91])<<8 | int(v[92])
	hlen := int(uint32(v[93])<<24 | uint32(v[94])<<16 | uint32(v[95])<<8 | uint32(v[96]))
	if status < 100 || status > 999 {
		return nil, corrupt("status")
	}
	if hlen > len(v)-recordHead {
		return nil, corrupt("header length")
	}
	h, err := codec.DecodeHeader(v[recordHead : recordHead+hlen])
	if err != nil {
		return nil, err
	}
	rec := &store.Record{
		Fingerprint: recordFingerprint(v),
		Response:    store.Response{Status: status, Header: h, BodyOmitted: v[2]&flagOmitted != 0},
		CreatedAt:   time.UnixMilli(get64(v, 51)),
		CompletedAt: time.UnixMilli(get64(v, 75)),
		ExpiresAt:   time.UnixMilli(get64(v, 83)),
	}
	if body := v[recordHead+hlen:]; body != "" {
		if rec.BodyOmitted {
			return nil, corrupt("omitted body")
		}
		rec.Body = []byte(body)
	}
	return rec, nil
}

// Record heads by flags: format, kind and the flags byte (Complete sends one).
const (
	headStored  = "\x02c\x00"
	headOmitted = "\x02c\x01"
)

// recordTail appends to b the part of a record after bytes 3-58: the nonce, the
// times, status, header length and headers (the body follows, sent apart), and
// returns it with the record's first three bytes.
func recordTail(b []byte, nonce store.Token, completed, expires int64, resp store.Response) (tail []byte, head string) {
	b = append(b, nonce[:]...)
	b = append64(b, completed)
	b = append64(b, expires)
	b = append(b, byte(resp.Status>>8), byte(resp.Status), 0, 0, 0, 0)
	at := len(b) // the headers' length goes in the 4 bytes before them
	b = codec.AppendHeader(b, resp.Header)
	n := uint32(len(b) - at)
	b[at-4], b[at-3], b[at-2], b[at-1] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	head = headStored
	if resp.BodyOmitted {
		head = headOmitted
	}
	return b, head
}

// encodeRecord returns a whole record (store/tiered's Fill), its times as given,
// with a zero token and nonce.
func encodeRecord(rec *store.Record) []byte {
	b := make([]byte, 59, recordHead+len(rec.Body)+64)
	copy(b[3:35], rec.Fingerprint[:])
	put64(b[51:], rec.CreatedAt.UnixMilli())
	b, head := recordTail(b, store.Token{}, rec.CompletedAt.UnixMilli(), rec.ExpiresAt.UnixMilli(), rec.Response)
	copy(b, head)
	return append(b, rec.Body...)
}

// put64 writes v big-endian into b[0:8].
func put64(b []byte, v int64) {
	for i := range 8 {
		b[i] = byte(uint64(v) >> (56 - 8*i))
	}
}

// append64 appends v big-endian to b.
func append64(b []byte, v int64) []byte {
	var w [8]byte
	put64(w[:], v)
	return append(b, w[:]...)
}

func get64(s string, i int) int64 {
	var u uint64
	for j := range 8 {
		u = u<<8 | uint64(s[i+j])
	}
	return int64(u)
}
