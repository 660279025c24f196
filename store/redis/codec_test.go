package redis

import (
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/idemkey/idemkey/store"
)

func TestHeaderRoundTrip(t *testing.T) {
	tests := []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"X-Multi": {"one", "two", ""}, "Location": {"/payments/42"}, "X-Empty": {}},
		{"X-Binary": {"\x00\xff\r\n"}, "X-Long": {string(make([]byte, 300))}},
	}
	for _, h := range tests {
		got, err := decodeHeader(string(encodeHeader(h)))
		if err != nil {
			t.Fatalf("%v: %v", h, err)
		}
		if len(h) == 0 {
			if got != nil {
				t.Errorf("empty header decoded as %v", got)
			}
			continue
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("round trip %q -> %q", h, got)
		}
	}
}

func TestDecodeHeaderGarbage(t *testing.T) {
	for _, s := range []string{"\x01", "\x01\x05ab", "\x01\x01a\x02\x01x", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "\x00trailing"} {
		if _, err := decodeHeader(s); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("decodeHeader(%q): %v, want ErrCorrupt", s, err)
		}
	}
}

// FuzzDecodeHeader: any bytes under the header field give a header or ErrCorrupt,
// never a panic, and a decoded header re-encodes to an equal header.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(string(encodeHeader(http.Header{"A": {"b", "c"}})))
	f.Add("\x01\x01a\x01\x01b")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := decodeHeader(s)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := decodeHeader(string(encodeHeader(h)))
		if err != nil || len(again) != len(h) {
			t.Fatalf("re-encoding %q: %v %v", h, again, err)
		}
	})
}

func TestReplyGarbage(t *testing.T) {
	for _, v := range []any{nil, "x", []any{}, []any{"1"}, []any{int64(-1)}, []any{int64(1)}, []any{int64(3)},
		[]any{int64(2), "x"}, []any{int64(2), "1", "2", "3", "9999", "", "", ""}, []any{int64(9)}} {
		if _, err := claimResult(v, store.Fingerprint{}, store.NewToken()); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("claimResult(%#v): %v, want ErrCorrupt", v, err)
		}
	}
}
