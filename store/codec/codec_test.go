package codec

import (
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   http.Header
		want http.Header
	}{
		{"nil", nil, nil},
		{"empty", http.Header{}, nil},
		{"only empty values", http.Header{"X-Empty": {}}, nil},
		{"one", http.Header{"Content-Type": {"application/json"}}, http.Header{"Content-Type": {"application/json"}}},
		{"several values and empty value", http.Header{"Link": {"<a>", "", "<b>"}, "Etag": {`"x"`}},
			http.Header{"Link": {"<a>", "", "<b>"}, "Etag": {`"x"`}}},
		{"binary and long", http.Header{"X-Bin": {"\x00\xff\n", strings.Repeat("v", 300)}},
			http.Header{"X-Bin": {"\x00\xff\n", strings.Repeat("v", 300)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := EncodeHeader(tc.in)
			if tc.want == nil && b != nil {
				t.Fatalf("encode gave %d bytes, want nil (SQL NULL)", len(b))
			}
			got, err := DecodeHeader(string(b))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("round trip: %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHeaderCorrupt(t *testing.T) {
	good := EncodeHeader(http.Header{"Content-Type": {"text/plain"}})
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"unknown format", append([]byte{2}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(append([]byte{}, good...), 0)},
		{"huge count", []byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"overlong varint", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"string past end", []byte{1, 1, 50, 'a'}},
		{"empty name", []byte{1, 1, 0, 1, 1, 'v'}},
		{"format byte only with no count", []byte{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := DecodeHeader(string(tc.in))
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("decode(%x) = %v, %v; want ErrCorrupt", tc.in, h, err)
			}
		})
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(EncodeHeader(http.Header{"A": {"1", "2"}, "B": {""}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(string(b))
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if again, err := DecodeHeader(string(EncodeHeader(h))); err != nil || len(again) != len(h) {
			t.Fatalf("re-encoding %q: %q, %v", h, again, err)
		}
	})
}

func TestMillisRoundsUpWithoutOverflow(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{1, 1},
		{time.Millisecond, 1},
		{time.Millisecond + 1, 2},
		{1999 * time.Microsecond, 2},
		{time.Hour, 3_600_000},
		{math.MaxInt64, 9_223_372_036_855},
	} {
		if got := Millis(tc.d); got != tc.want {
			t.Errorf("Millis(%d) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// The decoded names share one array of values: appending to one name's values
// must not write over the next name's.
func TestDecodeHeaderAppendKeepsOtherNames(t *testing.T) {
	h, err := DecodeHeader(string(EncodeHeader(http.Header{"A": {"1"}, "B": {"2"}, "C": {"3", "4"}})))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"A", "B", "C"} {
		h[name] = append(h[name], "x")
	}
	want := http.Header{"A": {"1", "x"}, "B": {"2", "x"}, "C": {"3", "4", "x"}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("got %v, want %v", h, want)
	}
}

func BenchmarkDecodeHeader(b *testing.B) {
	enc := string(EncodeHeader(http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/42"}, "X-Request-Id": {"abc"}}))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeHeader(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzEncodeHeader: whatever header a handler sets (any names, including the
// empty one, any values, names without values) encodes to bytes that
// DecodeHeader reads back as the header net/http would have sent: every
// non-empty name with its values. A record whose headers its own decoder
// refuses answers every replay with ErrCorrupt (a 503) for its whole
// retention.
func FuzzEncodeHeader(f *testing.F) {
	f.Add("\x00v\x00X-A\x001")
	f.Add("X-A\x00\x00\x00")
	f.Add("Link\x00<a>\x00Link\x00\x00\x00\x00")
	f.Fuzz(func(t *testing.T, spec string) {
		// spec is name, value, name, value, ... separated by NUL; a name whose
		// value is missing has no values.
		in, want := http.Header{}, http.Header{}
		parts := strings.Split(spec, "\x00")
		for i := 0; i < len(parts); i += 2 {
			name := parts[i]
			if _, ok := in[name]; !ok {
				in[name] = nil
			}
			if i+1 < len(parts) {
				in[name] = append(in[name], parts[i+1])
			}
		}
		for name, vals := range in {
			if name != "" && len(vals) > 0 {
				want[name] = vals
			}
		}
		got, err := DecodeHeader(string(EncodeHeader(in)))
		if err != nil {
			t.Fatalf("DecodeHeader(EncodeHeader(%q)): %v", in, err)
		}
		if len(want) == 0 {
			want = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip of %q: %q, want %q", in, got, want)
		}
	})
}
