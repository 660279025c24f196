package codec

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idemkey/idemkey/store"
)

// TestDecodeResponse: a well-formed row decodes; each malformed one is
// ErrCorrupt, never a panic.
func TestDecodeResponse(t *testing.T) {
	h := EncodeHeader(http.Header{"Content-Type": {"application/json"}})
	got, err := DecodeResponse(201, h, []byte("{}"), false, 0)
	if err != nil || got.Status != 201 || got.Header.Get("Content-Type") != "application/json" || string(got.Body) != "{}" {
		t.Fatalf("DecodeResponse = %+v, %v", got, err)
	}
	if got, err := DecodeResponse(200, nil, nil, true, 0); err != nil || !got.BodyOmitted || got.Header != nil {
		t.Fatalf("omitted body: %+v, %v", got, err)
	}
	for name, tc := range map[string]struct {
		status  int
		headers []byte
		body    []byte
		omitted bool
		max     int
	}{
		"status 99":           {99, nil, nil, false, 0},
		"status 1000":         {1000, nil, nil, false, 0},
		"body and omitted":    {200, nil, []byte("x"), true, 0},
		"body over the cap":   {200, nil, []byte("xyz"), false, 2},
		"headers truncated":   {200, h[:len(h)-1], nil, false, 0},
		"headers, bad format": {200, []byte{9}, nil, false, 0},
	} {
		if _, err := DecodeResponse(tc.status, tc.headers, tc.body, tc.omitted, tc.max); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}
