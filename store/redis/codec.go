package redis

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// keyFor returns the Redis key of id:
//
//	<prefix>{<len(scope) in decimal>:<scope><key>}
//
// The length prefix makes the layout injective for arbitrary bytes (the scope ends
// where its length says, the key runs to the final brace). The braces are the Cluster
// hash tag: Redis hashes the bytes from the first "{" to the first "}" after it, a
// deterministic function of the key name that is never empty here (it starts with a
// digit), so all keys of one (scope, key) share a slot. A "}" inside scope or key only
// shortens the tag; a "{" inside the prefix makes the prefix's tag win, which stays
// correct (every script touches a single key) but puts every record in one slot.
func keyFor(prefix string, id store.ID) string {
	var n [20]byte
	ls := strconv.AppendInt(n[:0], int64(len(id.Scope)), 10)
	var b strings.Builder
	b.Grow(len(prefix) + len(ls) + len(id.Scope) + len(id.Key) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	b.Write(ls)
	b.WriteByte(':')
	b.WriteString(id.Scope)
	b.WriteString(id.Key)
	b.WriteByte('}')
	return b.String()
}

func corrupt(what string) error {
	return fmt.Errorf("idemkey/store/redis: %w: bad %s", store.ErrCorrupt, what)
}

// reply is a script's reply: an array whose first element is the result code.
type reply []any

// asReply decodes a script's reply: the plain integer code of a script with
// nothing else to say, or an array whose first element is the code; -1 (foreign
// data) is store.ErrCorrupt.
func asReply(v any) (reply, int64, error) {
	if code, ok := v.(int64); ok {
		if code == -1 {
			return nil, 0, errForeign
		}
		return nil, code, nil
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return nil, 0, corrupt("script reply")
	}
	code, ok := a[0].(int64)
	if !ok {
		return nil, 0, corrupt("script reply code")
	}
	if code == -1 {
		return nil, 0, errForeign
	}
	return a, code, nil
}

var errForeign = fmt.Errorf("idemkey/store/redis: %w: foreign data under the record key", store.ErrCorrupt)

func (r reply) str(i int) (string, bool) {
	if i >= len(r) {
		return "", false
	}
	switch v := r[i].(type) {
	case string:
		return v, true
	case nil:
		return "", true
	}
	return "", false
}

func (r reply) int(i int) (int64, bool) {
	if i >= len(r) {
		return 0, false
	}
	v, ok := r[i].(int64)
	return v, ok
}

// record decodes {2, ca, cd, ex, s, h, b, o} into a Record with fingerprint fp.
func (r reply) record(fp store.Fingerprint) (*store.Record, error) {
	var f [7]string
	for i := range f {
		s, ok := r.str(i + 1)
		if !ok {
			return nil, corrupt("completed record")
		}
		f[i] = s
	}
	var ms [3]int64
	for i := range ms {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return nil, corrupt("timestamp")
		}
		ms[i] = v
	}
	status, err := strconv.Atoi(f[3])
	if err != nil || status < 100 || status > 999 {
		return nil, corrupt("status")
	}
	h, err := codec.DecodeHeader(f[4])
	if err != nil {
		return nil, err
	}
	rec := &store.Record{
		Fingerprint: fp,
		Response: store.Response{
			Status:      status,
			Header:      h,
			BodyOmitted: f[6] == "1",
		},
		CreatedAt:   time.UnixMilli(ms[0]),
		CompletedAt: time.UnixMilli(ms[1]),
		ExpiresAt:   time.UnixMilli(ms[2]),
	}
	if f[5] != "" {
		rec.Body = []byte(f[5])
	}
	if rec.BodyOmitted && len(rec.Body) > 0 {
		return nil, corrupt("omitted body")
	}
	return rec, nil
}
