package codec

import (
	"fmt"
	"math"
	"time"

	"github.com/idemkey/idemkey/store"
)

// DecodeResponse checks and decodes a stored response as a SQL store reads its
// columns (store/postgres, store/mysql): status, the headers in the encoding of
// EncodeHeader, the body and its omitted mark. maxBody is the store's body cap
// (0: none). Errors wrap store.ErrCorrupt: a status outside 100-999, a body next
// to the omitted mark, a body over the cap, headers that do not decode. body is
// kept as the Response's Body (nil when empty).
func DecodeResponse(status int, headers, body []byte, omitted bool, maxBody int) (store.Response, error) {
	switch {
	case status < 100 || status > 999:
		return store.Response{}, fmt.Errorf("%w: status %d outside 100-999", store.ErrCorrupt, status)
	case omitted && len(body) > 0:
		return store.Response{}, fmt.Errorf("%w: body stored although marked omitted", store.ErrCorrupt)
	case maxBody > 0 && len(body) > maxBody:
		return store.Response{}, fmt.Errorf("%w: stored body of %d bytes over the cap of %d", store.ErrCorrupt, len(body), maxBody)
	}
	h, err := DecodeHeader(string(headers))
	if err != nil {
		return store.Response{}, err
	}
	return store.Response{Status: status, Header: h, Body: body, BodyOmitted: omitted}, nil
}

// Row is a SQL store's read of a key's record that may not be claimed, as
// Answer judges it: store/postgres and store/mysql scan their columns into it.
type Row struct {
	// SameFingerprint is whether the stored fingerprint is the claimer's.
	SameFingerprint bool
	// Completed is whether a status is stored, Status that status.
	Completed bool
	Status    int
	// Headers, Body and BodyOmitted are the stored response.
	Headers, Body []byte
	BodyOmitted   bool
	// HasLease is whether a lease deadline is stored, RetryMS the rest of that
	// lease in milliseconds, rounded up, on the server's clock.
	HasLease bool
	RetryMS  int64
	// HasTimes is whether the three times are stored.
	HasTimes                          bool
	CreatedAt, CompletedAt, ExpiresAt time.Time
}

// Answer is the claim's answer from a record it may not take: Mismatch (another
// fingerprint), InFlight (with the rest of the lease, at least 0, clamped so it
// cannot overflow) or Completed (the record, through DecodeResponse with the
// store's body cap). Errors wrap store.ErrCorrupt: an in-flight record without a
// lease deadline, a completed one without its times, a response DecodeResponse
// refuses.
func Answer(r *Row, fp store.Fingerprint, maxBody int) (store.ClaimResult, error) {
	switch {
	case !r.SameFingerprint:
		return store.ClaimResult{Outcome: store.Mismatch}, nil
	case !r.Completed && !r.HasLease:
		return store.ClaimResult{}, fmt.Errorf("%w: in-flight record without a lease deadline", store.ErrCorrupt)
	case !r.Completed:
		ms := min(max(r.RetryMS, 0), int64(math.MaxInt64/time.Millisecond))
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(ms) * time.Millisecond}, nil
	case !r.HasTimes:
		return store.ClaimResult{}, fmt.Errorf("%w: completed record without its timestamps", store.ErrCorrupt)
	}
	resp, err := DecodeResponse(r.Status, r.Headers, r.Body, r.BodyOmitted, maxBody)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return store.ClaimResult{Outcome: store.Completed, Record: &store.Record{Fingerprint: fp, Response: resp,
		CreatedAt: r.CreatedAt, CompletedAt: r.CompletedAt, ExpiresAt: r.ExpiresAt}}, nil
}
