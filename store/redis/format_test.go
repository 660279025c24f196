package redis

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// FuzzDecodeRecord: any value that kindOf calls a record decodes to a record
// or to store.ErrCorrupt, never a panic; what decodes is a valid response
// (status 100-999, no body when omitted) that encodes back to the same record.
func FuzzDecodeRecord(f *testing.F) {
	rec := &store.Record{Fingerprint: store.Fingerprint{7}, Response: store.Response{Status: 201,
		Header: http.Header{"Location": {"/a"}, "X-A": {"1", ""}}, Body: []byte("\x02c\x00body")},
		CreatedAt: time.UnixMilli(1), CompletedAt: time.UnixMilli(2), ExpiresAt: time.UnixMilli(3)}
	f.Add(encodeRecord(rec))
	f.Add(encodeRecord(&store.Record{Response: store.Response{Status: 999, BodyOmitted: true}}))
	f.Add(append([]byte{2, 'c', 1}, make([]byte, 200)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		v := string(b)
		if kindOf(v) != kindRecord {
			return
		}
		rec, err := decodeRecord(v)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("decodeRecord: %v, want ErrCorrupt", err)
			}
			return
		}
		if err := store.ValidateResponse(rec.Response, time.Second); err != nil {
			t.Fatalf("decoded an invalid response %+v: %v", rec.Response, err)
		}
		again, err := decodeRecord(string(encodeRecord(rec)))
		if err != nil || !sameRecord(rec, again) {
			t.Fatalf("re-encoded record decodes to %+v %v, want %+v", again, err, rec)
		}
	})
}

// FuzzDecodeMarker: any value kindOf calls a marker decodes without a panic,
// its remaining lease never exceeds the key's life, and putMarker writes back
// the same bytes but the flags.
func FuzzDecodeMarker(f *testing.F) {
	m := make([]byte, markerLen)
	putMarker(m, store.Fingerprint{1}, store.Token{2}, 1700000000000, 59000)
	f.Add(m, int64(60000))
	f.Add(append([]byte{2, 'p', 1}, bytes.Repeat([]byte{0xff}, 64)...), int64(1))
	f.Fuzz(func(t *testing.T, b []byte, pttlMs int64) {
		v := string(b)
		if kindOf(v) != kindMarker {
			return
		}
		mk := decodeMarker(v)
		if pttlMs > 0 && pttlMs <= maxTTL {
			pttl := millis(pttlMs)
			if left := mk.remaining(pttl); left > pttl {
				t.Fatalf("remaining %v > the key's PTTL %v", left, pttl)
			}
		}
		w := make([]byte, markerLen)
		putMarker(w, mk.fp, mk.token, mk.created, mk.lease)
		w[2] = v[2]
		if string(w) != v {
			t.Fatalf("putMarker(decodeMarker(%x)) = %x", v, w)
		}
	})
}

// FuzzRecordRoundTrip: whatever bytes a response's headers and body hold, the
// record encodes to a value kindOf calls a record and decodes to the same
// response and times (header names that are empty are left to
// TestEmptyHeaderName).
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(200, "Content-Type", "a\x00\r\nb", []byte("\x02p"), false, int64(0), int64(-1))
	f.Add(999, "X", "", []byte{}, true, int64(-62135596800000), int64(1<<62))
	f.Fuzz(func(t *testing.T, status int, name, value string, body []byte, omitted bool, created, completed int64) {
		resp := store.Response{Status: status, Body: body, BodyOmitted: omitted}
		if name != "" {
			resp.Header = http.Header{name: {value, name}}
		}
		if store.ValidateResponse(resp, time.Second) != nil {
			return
		}
		rec := &store.Record{Fingerprint: store.Fingerprint{byte(status)}, Response: resp,
			CreatedAt: time.UnixMilli(created), CompletedAt: time.UnixMilli(completed), ExpiresAt: time.UnixMilli(completed + 1)}
		v := string(encodeRecord(rec))
		if kindOf(v) != kindRecord {
			t.Fatalf("kindOf(encodeRecord) = %d", kindOf(v))
		}
		got, err := decodeRecord(v)
		if err != nil || !sameRecord(rec, got) {
			t.Fatalf("decodeRecord(encodeRecord(%+v)) = %+v %v", rec, got, err)
		}
	})
}

// sameRecord compares records as a replay sees them (nil and empty bodies and
// headers alike; times at ms precision).
func sameRecord(a, b *store.Record) bool {
	norm := func(h http.Header) http.Header {
		if len(h) == 0 {
			return nil
		}
		return h
	}
	return a.Fingerprint == b.Fingerprint && a.Status == b.Status && a.BodyOmitted == b.BodyOmitted &&
		bytes.Equal(a.Body, b.Body) && reflect.DeepEqual(norm(a.Header), norm(b.Header)) &&
		a.CreatedAt.UnixMilli() == b.CreatedAt.UnixMilli() && a.CompletedAt.UnixMilli() == b.CompletedAt.UnixMilli() &&
		a.ExpiresAt.UnixMilli() == b.ExpiresAt.UnixMilli()
}
