package encrypted_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/encrypted"
	"github.com/idemkey/idemkey/store/memory"
)

// FuzzOpenForeignRecord: whatever the wrapped store holds that the wrapper
// did not seal for this ID (any sealed line, body, status, omitted mark), a
// claim answers an error wrapping store.ErrCorrupt: no panic, no replay.
func FuzzOpenForeignRecord(f *testing.F) {
	key := newKey(f, "k1")
	seed := memory.New()
	complete(f, wrap(f, seed, key), store.ID{Key: "seed"}, secretResponse(40))
	rec, err := replay(seed, store.ID{Key: "seed"})
	if err != nil {
		f.Fatal(err)
	}
	// The sealed record itself, under another ID: moved, so it must not open.
	f.Add(rec.Header.Get(encrypted.SealedHeader), rec.Body, 201, false)
	f.Add("AQJrMQ", []byte("body"), 200, false)
	f.Add("", []byte(nil), 204, true)
	f.Add("!!!", []byte{0}, 999, false)
	f.Fuzz(func(t *testing.T, line string, body []byte, status int, omitted bool) {
		if status < 100 || status > 999 || omitted && len(body) > 0 {
			return
		}
		inner := memory.New()
		resp := store.Response{Status: status, Body: body, BodyOmitted: omitted}
		if line != "" {
			resp.Header = http.Header{encrypted.SealedHeader: {line}}
		}
		complete(t, inner, store.ID{Key: "fuzz"}, resp)
		rec, err := replay(wrap(t, inner, key), store.ID{Key: "fuzz"})
		if !errors.Is(err, store.ErrCorrupt) || rec != nil {
			t.Fatalf("foreign record opened: %v, %v", rec, err)
		}
	})
}
