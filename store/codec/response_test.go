package codec

import (
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

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

// TestAnswer: each kind of row gets its outcome; rows missing what their state
// needs are ErrCorrupt; a huge remaining lease is clamped, not overflowed.
func TestAnswer(t *testing.T) {
	var fp store.Fingerprint
	now := time.Unix(1700000000, 0).UTC()
	for name, tc := range map[string]struct {
		row     Row
		want    store.Outcome
		corrupt bool
	}{
		"mismatch":              {Row{}, store.Mismatch, false},
		"in flight":             {Row{SameFingerprint: true, HasLease: true, RetryMS: 1500}, store.InFlight, false},
		"in flight, no lease":   {Row{SameFingerprint: true}, 0, true},
		"completed":             {Row{SameFingerprint: true, Completed: true, Status: 201, HasTimes: true, CreatedAt: now, CompletedAt: now, ExpiresAt: now}, store.Completed, false},
		"completed, no times":   {Row{SameFingerprint: true, Completed: true, Status: 201}, 0, true},
		"completed, bad status": {Row{SameFingerprint: true, Completed: true, Status: 42, HasTimes: true}, 0, true},
	} {
		res, err := Answer(&tc.row, fp, 0)
		switch {
		case tc.corrupt && !errors.Is(err, store.ErrCorrupt):
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		case !tc.corrupt && (err != nil || res.Outcome != tc.want):
			t.Errorf("%s: %+v %v, want %v", name, res, err, tc.want)
		}
	}
	res, _ := Answer(&Row{SameFingerprint: true, HasLease: true, RetryMS: 1500}, fp, 0)
	if res.RetryAfter != 1500*time.Millisecond {
		t.Errorf("RetryAfter %v, want 1.5s", res.RetryAfter)
	}
	res, _ = Answer(&Row{SameFingerprint: true, HasLease: true, RetryMS: math.MaxInt64}, fp, 0)
	if res.RetryAfter <= 0 {
		t.Errorf("a huge lease gave RetryAfter %v", res.RetryAfter)
	}
	res, _ = Answer(&Row{SameFingerprint: true, HasLease: true, RetryMS: -5}, fp, 0)
	if res.RetryAfter != 0 {
		t.Errorf("a lease just ended gave RetryAfter %v, want 0", res.RetryAfter)
	}
}
