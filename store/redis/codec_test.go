package redis

import (
	"errors"
	"testing"

	"github.com/idemkey/idemkey/store"
)

func TestReplyGarbage(t *testing.T) {
	for _, v := range []any{nil, "x", []any{}, []any{"1"}, []any{int64(-1)}, []any{int64(1)}, []any{int64(3)},
		[]any{int64(2), "x"}, []any{int64(2), "1", "2", "3", "9999", "", "", ""}, []any{int64(9)}} {
		if _, err := claimResult(v, store.Fingerprint{}, store.NewToken()); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("claimResult(%#v): %v, want ErrCorrupt", v, err)
		}
	}
}
