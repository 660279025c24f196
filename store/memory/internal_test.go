package memory

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformanceSharedHash runs the store suite with every ID under one hash,
// so each record is found, replaced and removed through the chain of records
// sharing it.
func TestConformanceSharedHash(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		c := testclock.New(time.Unix(1_700_000_000, 0))
		s := New(WithClock(c.Now), WithShards(1))
		s.hashMask = 0
		return storetest.Subject{Store: s, Wait: c.Add}
	})
}

// The stored header comes back with every value in its order, whatever the
// lengths (a length over 127 bytes takes two bytes to encode), and the body
// after it is untouched.
func TestResponseCopyRoundTrip(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, h := range []http.Header{
		nil,
		{},
		{"X-None": {}},
		{"X-Empty": {""}},
		{"Content-Type": {"application/json"}, "Link": {"<a>", long, "<c>"}, strings.Repeat("N", 200): {long}},
	} {
		for _, body := range [][]byte{nil, []byte("{}"), []byte(long)} {
			data, n := copyResponse(h, body)
			e := &entry{data: data, fieldsLen: int32(n)}
			if b := e.body(); !bytes.Equal(b, body) || (len(body) == 0) != (b == nil) {
				t.Fatalf("header %v: body %q came back as %q", h, body, b)
			}
			got := http.Header{}
			if n > 0 {
				got = headerFromFields(data[:n])
			}
			want := http.Header{}
			for k, vs := range h {
				if len(vs) > 0 {
					want[k] = vs
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("header %v came back as %v", want, got)
			}
		}
	}
}

// TestEntrySize keeps a record in the 176-byte size class on 64-bit platforms:
// one more word costs every first execution 16 bytes (the 192-byte class).
func TestEntrySize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit platforms")
	}
	if n := unsafe.Sizeof(entry{}); n > 176 {
		t.Fatalf("entry is %d bytes, over 176", n)
	}
}
