package dynamodb

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// Attribute names of a record item (docs/stores.md, DynamoDB). They are short
// because every name counts toward the item's size, and so toward its capacity
// units, on every read and write.
const (
	attrKey       = "pk"  // B: the encoded ID (partitionKey), the table's hash key
	attrFP        = "fp"  // B: the request's fingerprint, 32 bytes
	attrToken     = "tok" // B: the holder's fencing token, 16 bytes
	attrLease     = "ls"  // N: lease deadline, Unix ms; absent once completed
	attrExpires   = "ex"  // N: end of the retention, Unix ms; the read-side expiry
	attrTTL       = "ttl" // N: ex in Unix seconds, rounded up: DynamoDB's TTL attribute
	attrCreated   = "ca"  // N: first claim, Unix ms
	attrCompleted = "cd"  // N: completion, Unix ms; absent while in flight
	attrStatus    = "st"  // N: HTTP status; absent while in flight
	attrHeader    = "hd"  // B: headers (codec.EncodeHeader); absent when none
	attrBody      = "bd"  // B: body; absent when empty or omitted
	attrOmitted   = "om"  // BOOL: the body was omitted (over the cap or the item limit)
)

// MaxItemBytes is DynamoDB's item size limit (400 KB), attribute names and
// values included.
const MaxItemBytes = 400 * 1024

// itemOverhead bounds the bytes of a completed item other than its key, headers
// and body: the attribute names and the fingerprint, token, numbers and mark.
const itemOverhead = 256

// partitionKey encodes id as the hash key: the scope's length (uvarint), the
// scope, the key. Binary, so any bytes are kept (a string attribute must be
// UTF-8), and unambiguous, so ("a", "b:c") and ("a:b", "c") never meet. The
// empty ID encodes as the single byte 0, a key no record has (Ping reads it).
func partitionKey(id store.ID) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+len(id.Scope)+len(id.Key))
	b = binary.AppendUvarint(b, uint64(len(id.Scope)))
	b = append(b, id.Scope...)
	return append(b, id.Key...)
}

func keyOf(id store.ID) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: bin(partitionKey(id))}
}

func bin(b []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: b} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// unixMS is t in whole milliseconds since the Unix epoch.
func unixMS(t time.Time) int64 { return t.UnixMilli() }

// ttlSeconds is the TTL attribute for a deadline of ms: seconds, rounded up, so
// DynamoDB never deletes a record before the read side treats it as absent.
func ttlSeconds(ms int64) int64 { return (ms + 999) / 1000 }

// fromMS is the UTC time ms milliseconds after the Unix epoch.
func fromMS(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// record is a decoded item. Absent numbers are 0 with their has flag false.
type record struct {
	fp                   store.Fingerprint
	token                store.Token
	lease, expires       int64
	created, completed   int64
	status               int
	hasLease, hasStatus  bool
	hasCreated, hasCompl bool
	header, body         []byte
	omitted              bool
}

// decode reads an item the store wrote. Anything else (a missing or malformed
// attribute, foreign data under the key) wraps store.ErrCorrupt.
func decode(item map[string]types.AttributeValue) (*record, error) {
	var r record
	d := decoder{item: item}
	copy(r.fp[:], d.bytes(attrFP, len(r.fp)))
	copy(r.token[:], d.bytes(attrToken, len(r.token)))
	r.expires, _ = d.number(attrExpires, true)
	r.created, r.hasCreated = d.number(attrCreated, true)
	r.lease, r.hasLease = d.number(attrLease, false)
	r.completed, r.hasCompl = d.number(attrCompleted, false)
	st, hasSt := d.number(attrStatus, false)
	r.status, r.hasStatus = int(st), hasSt
	r.header = d.bytes(attrHeader, -1)
	r.body = d.bytes(attrBody, -1)
	if v, ok := item[attrOmitted]; ok {
		b, isBool := v.(*types.AttributeValueMemberBOOL)
		if !isBool {
			d.fail(attrOmitted, "not a boolean")
		} else {
			r.omitted = b.Value
		}
	}
	switch {
	case d.err != nil:
		return nil, d.err
	case r.hasStatus != r.hasCompl:
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: status and completion time disagree", store.ErrCorrupt)
	case !r.hasStatus && !r.hasLease:
		return nil, fmt.Errorf("idemkey/store/dynamodb: %w: in-flight record without a lease deadline", store.ErrCorrupt)
	}
	return &r, nil
}

type decoder struct {
	item map[string]types.AttributeValue
	err  error
}

func (d *decoder) fail(name, what string) {
	if d.err == nil {
		d.err = fmt.Errorf("idemkey/store/dynamodb: %w: attribute %s: %s", store.ErrCorrupt, name, what)
	}
}

// bytes reads a binary attribute of exactly size bytes (size < 0: optional, any
// length).
func (d *decoder) bytes(name string, size int) []byte {
	v, ok := d.item[name]
	if !ok {
		if size >= 0 {
			d.fail(name, "missing")
		}
		return nil
	}
	b, isBin := v.(*types.AttributeValueMemberB)
	switch {
	case !isBin:
		d.fail(name, "not binary")
		return nil
	case size >= 0 && len(b.Value) != size:
		d.fail(name, fmt.Sprintf("%d bytes, want %d", len(b.Value), size))
		return nil
	}
	return b.Value
}

func (d *decoder) number(name string, required bool) (int64, bool) {
	v, ok := d.item[name]
	if !ok {
		if required {
			d.fail(name, "missing")
		}
		return 0, false
	}
	n, isNum := v.(*types.AttributeValueMemberN)
	if !isNum {
		d.fail(name, "not a number")
		return 0, false
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		d.fail(name, "not an integer")
		return 0, false
	}
	return i, true
}

// answer is the claim's answer from a live record it may not take (see
// codec.Answer), judged at now (Unix ms).
func (r *record) answer(fp store.Fingerprint, now int64, maxBody int) (store.ClaimResult, error) {
	return codec.Answer(&codec.Row{
		SameFingerprint: r.fp == fp,
		Completed:       r.hasStatus, Status: r.status,
		Headers: r.header, Body: r.body, BodyOmitted: r.omitted,
		HasLease: r.hasLease, RetryMS: r.lease - now,
		HasTimes:  r.hasCreated && r.hasCompl,
		CreatedAt: fromMS(r.created), CompletedAt: fromMS(r.completed), ExpiresAt: fromMS(r.expires),
	}, fp, maxBody)
}

// live reports whether r is past neither its retention nor (when in flight)
// its holder's lease at now: Wait's test.
func (r *record) live(now int64) bool {
	return r.expires > now && !r.hasStatus && r.lease > now
}

// takeable reports whether a claim of fp may take r over at now: in flight, same
// fingerprint, lease expired, retention not.
func (r *record) takeable(fp store.Fingerprint, now int64) bool {
	return !r.hasStatus && r.fp == fp && r.lease <= now && r.expires > now
}

// leaseMillis is d in whole milliseconds, rounded up, as every store keeps it.
func leaseMillis(d time.Duration) int64 { return codec.Millis(d) }

// MaxBody is the longest body Complete keeps for id with header: a longer one
// would take the item over MaxItemBytes, so the record is kept with its body
// omitted. It is a little under 400 KB (the key, headers and the other
// attributes take the rest).
func MaxBody(id store.ID, header http.Header) int {
	return max(MaxItemBytes-itemOverhead-len(partitionKey(id))-len(codec.EncodeHeader(header)), 0)
}
