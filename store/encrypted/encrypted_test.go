package encrypted_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/encrypted"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/storetest"
)

func newKey(t testing.TB, id string) encrypted.Key {
	t.Helper()
	secret := make([]byte, encrypted.KeySize)
	rand.Read(secret)
	return encrypted.Key{ID: id, Secret: secret}
}

func wrap(t testing.TB, st store.Store, keys ...encrypted.Key) *encrypted.Store {
	t.Helper()
	e, err := encrypted.New(st, keys[0], keys[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestConformance runs the store contract over the memory store behind the
// wrapper.
func TestConformance(t *testing.T) {
	k := newKey(t, "k1")
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		clock := testclock.New(time.Unix(1_700_000_000, 0))
		return storetest.Subject{Store: wrap(t, memory.New(memory.WithClock(clock.Now)), k), Wait: clock.Add, SealsAnew: true}
	})
}

var ctx = context.Background()

// TestNewRejectsMisconfiguration: a keyring that cannot seal or open as asked
// fails at construction.
func TestNewRejectsMisconfiguration(t *testing.T) {
	good := newKey(t, "k1")
	for _, tc := range []struct {
		name    string
		st      store.Store
		current encrypted.Key
		prev    []encrypted.Key
	}{
		{"nil store", nil, good, nil},
		{"nil pointer store", (*memory.Store)(nil), good, nil},
		{"no current key", memory.New(), encrypted.Key{}, nil},
		{"empty id", memory.New(), encrypted.Key{Secret: good.Secret}, nil},
		{"id over 255 bytes", memory.New(), encrypted.Key{ID: strings.Repeat("k", 256), Secret: good.Secret}, nil},
		{"16-byte key (AES-128)", memory.New(), encrypted.Key{ID: "k", Secret: good.Secret[:16]}, nil},
		{"33-byte key", memory.New(), encrypted.Key{ID: "k", Secret: append(bytes.Clone(good.Secret), 0)}, nil},
		{"short previous key", memory.New(), good, []encrypted.Key{{ID: "k0", Secret: good.Secret[:31]}}},
		{"duplicate id", memory.New(), good, []encrypted.Key{newKey(t, "k1")}},
		{"all-zero secret (never filled)", memory.New(), encrypted.Key{ID: "k", Secret: make([]byte, encrypted.KeySize)}, nil},
		{"one secret under two ids (a rotation that rotates nothing)", memory.New(), good, []encrypted.Key{{ID: "k0", Secret: bytes.Clone(good.Secret)}}},
	} {
		if s, err := encrypted.New(tc.st, tc.current, tc.prev...); err == nil || s != nil {
			t.Errorf("%s: New = %v, %v; want an error", tc.name, s, err)
		}
	}
}

// complete claims id on st and completes it with resp.
func complete(t testing.TB, st store.Store, id store.ID, resp store.Response) {
	t.Helper()
	res, err := st.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim %v: %v %v", id, res.Outcome, err)
	}
	if err := st.Complete(ctx, id, res.Token, resp, time.Hour); err != nil {
		t.Fatalf("complete %v: %v", id, err)
	}
}

// replay claims id on st again and returns the stored record, or the error.
func replay(st store.Store, id store.ID) (*store.Record, error) {
	res, err := st.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		return nil, err
	}
	if res.Outcome != store.Completed {
		return nil, fmt.Errorf("outcome %v, want completed", res.Outcome)
	}
	return res.Record, nil
}

// secretResponse is a response whose body and header values are random
// printable bytes (n of body), distinct from anything else in a store.
func secretResponse(n int) store.Response {
	rnd := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		for i := range b {
			b[i] = 'a' + b[i]%26
		}
		return b
	}
	return store.Response{Status: 201, Body: rnd(n), Header: http.Header{
		"Content-Type": {"application/json"}, "X-Card-Token": {string(rnd(24)), string(rnd(40))}}}
}

// leak returns the first 8-byte window of secret found in dump, or "".
func leak(dump, secret []byte) string {
	for i := 0; i+8 <= len(secret); i++ {
		if bytes.Contains(dump, secret[i:i+8]) {
			return string(secret[i : i+8])
		}
	}
	return ""
}

// TestRoundTripAndNothingInClear: for bodies of many sizes (empty to 64 KiB)
// and headers with several values, the wrapper replays exactly what was
// completed, while the wrapped store holds no 8-byte window of the body or of
// a header value.
func TestRoundTripAndNothingInClear(t *testing.T) {
	inner := memory.New()
	st := wrap(t, inner, newKey(t, "k1"))
	for i, n := range []int{0, 1, 8, 100, 128, 1024, 4000, 65536} {
		id := store.ID{Scope: "tenant", Key: fmt.Sprint("key-", i)}
		resp := secretResponse(n)
		complete(t, st, id, resp)
		rec, err := replay(st, id)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if rec.Status != resp.Status || !bytes.Equal(rec.Body, resp.Body) || fmt.Sprint(rec.Header) != fmt.Sprint(resp.Header) || rec.BodyOmitted {
			t.Fatalf("%d bytes: replayed %d %v %q, want %d %v %q", n, rec.Status, rec.Header, rec.Body, resp.Status, resp.Header, resp.Body)
		}
		raw, err := replay(inner, id)
		if err != nil {
			t.Fatal(err)
		}
		dump := append([]byte(fmt.Sprint(raw.Header)), raw.Body...)
		for _, secret := range [][]byte{resp.Body, []byte(resp.Header["X-Card-Token"][0]), []byte(resp.Header["X-Card-Token"][1])} {
			if w := leak(dump, secret); w != "" {
				t.Fatalf("%d bytes: the wrapped store holds %q in clear", n, w)
			}
		}
		if len(raw.Body) != n || raw.Status != resp.Status {
			t.Errorf("%d bytes: stored body %d bytes, status %d", n, len(raw.Body), raw.Status)
		}
	}
}

// TestRotation: a record sealed with key 1 still replays once key 2 is
// current (key 1 kept as previous); new records are sealed with key 2 and do
// not open without it; a Store without key 1 refuses the old record.
func TestRotation(t *testing.T) {
	inner := memory.New()
	k1, k2 := newKey(t, "2026-11"), newKey(t, "2026-12")
	old, fresh := store.ID{Key: "old"}, store.ID{Key: "new"}
	oldResp, freshResp := secretResponse(128), secretResponse(128)
	complete(t, wrap(t, inner, k1), old, oldResp)

	rotated := wrap(t, inner, k2, k1)
	if rec, err := replay(rotated, old); err != nil || !bytes.Equal(rec.Body, oldResp.Body) {
		t.Fatalf("old record after rotation: %v", err)
	}
	complete(t, rotated, fresh, freshResp)
	if rec, err := replay(rotated, fresh); err != nil || !bytes.Equal(rec.Body, freshResp.Body) {
		t.Fatalf("new record: %v", err)
	}
	if _, err := replay(wrap(t, inner, k1), fresh); !errors.Is(err, encrypted.ErrUnknownKey) {
		t.Errorf("new record under key 1 only: %v, want ErrUnknownKey", err)
	}
	if _, err := replay(wrap(t, inner, k2), old); !errors.Is(err, encrypted.ErrUnknownKey) || !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("old record after key 1 was dropped: %v, want ErrUnknownKey (store.ErrCorrupt)", err)
	}
	// The same id under another secret is not the same key.
	if _, err := replay(wrap(t, inner, encrypted.Key{ID: "2026-12", Secret: k1.Secret}), fresh); !errors.Is(err, encrypted.ErrTampered) {
		t.Errorf("new record under a different secret with the same id: %v, want ErrTampered", err)
	}
}

// TestMovedOrChangedRecordRefused: a sealed record copied under another key
// or scope, or with any stored field changed under its own ID (status,
// omitted mark, body, the sealed line, the key id, bytes moved between the
// body and the sealed line), or written without the wrapper, does not open:
// the claim fails with an error wrapping store.ErrCorrupt (never a replay,
// never Claimed), and the record stays as it was.
func TestMovedOrChangedRecordRefused(t *testing.T) {
	inner := memory.New()
	st := wrap(t, inner, newKey(t, "k1"))
	src := store.ID{Scope: "alice", Key: "pay-1"}
	complete(t, st, src, secretResponse(64))
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 1; return b }
	// parts splits a sealed line into its prefix and nonce, the headers'
	// ciphertext and the tag; join is its inverse.
	parts := func(r store.Response) (head, hct, tag []byte) {
		b, err := base64.RawStdEncoding.DecodeString(r.Header.Get(encrypted.SealedHeader))
		if err != nil {
			t.Fatal(err)
		}
		n := 2 + int(b[1]) + 12
		return b[:n:n], b[n : len(b)-16 : len(b)-16], b[len(b)-16:]
	}
	join := func(status int, body []byte, line ...[]byte) store.Response {
		return store.Response{Status: status, Body: body,
			Header: http.Header{encrypted.SealedHeader: {base64.RawStdEncoding.EncodeToString(bytes.Join(line, nil))}}}
	}
	for _, tc := range []struct {
		name   string
		change func(id store.ID, r store.Response) store.Response
		want   error
	}{
		{"moved to another key", func(store.ID, store.Response) store.Response { return st.Seal(src, secretResponse(64)) }, encrypted.ErrTampered},
		{"moved to another scope", func(id store.ID, _ store.Response) store.Response {
			return st.Seal(store.ID{Scope: "mallory", Key: id.Key}, secretResponse(64))
		}, encrypted.ErrTampered},
		{"other status", func(_ store.ID, r store.Response) store.Response { r.Status = 200; return r }, encrypted.ErrTampered},
		{"body bit flipped", func(_ store.ID, r store.Response) store.Response { r.Body = flip(r.Body, 3); return r }, encrypted.ErrTampered},
		{"body cut", func(_ store.ID, r store.Response) store.Response { r.Body = r.Body[:10]; return r }, encrypted.ErrTampered},
		{"marked omitted", func(_ store.ID, r store.Response) store.Response { r.Body, r.BodyOmitted = nil, true; return r }, encrypted.ErrTampered},
		{"sealed line changed", func(_ store.ID, r store.Response) store.Response {
			head, hct, tag := parts(r)
			return join(r.Status, r.Body, head, hct, flip(tag, 0))
		}, encrypted.ErrTampered},
		{"headers' ciphertext moved into the body", func(_ store.ID, r store.Response) store.Response {
			head, hct, tag := parts(r)
			return join(r.Status, append(bytes.Clone(r.Body), hct...), head, tag)
		}, encrypted.ErrTampered},
		{"body's last bytes moved into the sealed line", func(_ store.ID, r store.Response) store.Response {
			head, hct, tag := parts(r)
			n := len(r.Body) - 5
			return join(r.Status, r.Body[:n], head, r.Body[n:], hct, tag)
		}, encrypted.ErrTampered},
		{"unknown key id (k1 renamed x1)", func(_ store.ID, r store.Response) store.Response {
			head, hct, tag := parts(r)
			head = bytes.Clone(head)
			head[2] = 'x'
			return join(r.Status, r.Body, head, hct, tag)
		}, encrypted.ErrUnknownKey},
		{"written without the wrapper", func(store.ID, store.Response) store.Response {
			return store.Response{Status: 201, Body: []byte(`{"card":"4242"}`)}
		}, encrypted.ErrTampered},
	} {
		id := store.ID{Scope: "alice", Key: tc.name}
		complete(t, inner, id, tc.change(id, st.Seal(id, secretResponse(64))))
		if rec, err := replay(st, id); !errors.Is(err, tc.want) || !errors.Is(err, store.ErrCorrupt) || rec != nil {
			t.Errorf("%s: claim = %v, %v; want %v", tc.name, rec, err, tc.want)
		}
		if _, err := replay(inner, id); err != nil {
			t.Errorf("%s: the record changed after the refused claim: %v", tc.name, err)
		}
	}
	if _, err := replay(st, src); err != nil {
		t.Errorf("the original still replays: %v", err)
	}
}

// TestSealForCompletionOutsideTheWrapper: a response completed directly on
// the wrapped store (as store/postgres CompleteTx does inside a handler's
// transaction) replays through the wrapper when it was given as Seal's
// result, sealed for the same ID.
func TestSealForCompletionOutsideTheWrapper(t *testing.T) {
	inner := memory.New()
	st := wrap(t, inner, newKey(t, "k1"))
	id := store.ID{Scope: "s", Key: "in-tx"}
	resp := secretResponse(300)
	complete(t, inner, id, st.Seal(id, resp))
	rec, err := replay(st, id)
	if err != nil || !bytes.Equal(rec.Body, resp.Body) || fmt.Sprint(rec.Header) != fmt.Sprint(resp.Header) {
		t.Fatalf("replay of a Seal'd response: %v", err)
	}
	raw, _ := replay(inner, id)
	if w := leak(append(bytes.Clone(raw.Body), raw.Header.Get(encrypted.SealedHeader)...), resp.Body); w != "" {
		t.Errorf("Seal left %q in clear", w)
	}
}

// copyKeeper keeps the response NotifyCompleted hands it as the record, as
// store/tiered's cache does.
type copyKeeper struct{ *memory.Store }

func (c copyKeeper) NotifyCompleted(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) {
	_ = c.Complete(ctx, id, token, resp, retention)
}

// TestNotifyCompletedOfSealedResponse: a handler that completed its record in
// its own transaction hands the middleware (MarkCompleted, which
// store/postgres CommitResponse calls with the response it stored) either the
// plain response or Seal's result; the copy the wrapper passes on replays the
// plain response in both cases, never the sealed form sealed a second time.
func TestNotifyCompletedOfSealedResponse(t *testing.T) {
	for _, sealedFirst := range []bool{false, true} {
		inner := copyKeeper{memory.New()}
		st := wrap(t, inner, newKey(t, "k1"))
		id := store.ID{Scope: "s", Key: fmt.Sprint("notify-", sealedFirst)}
		resp := secretResponse(100)
		res, err := inner.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		notified := resp
		if sealedFirst {
			notified = st.Seal(id, resp)
		}
		st.NotifyCompleted(ctx, id, res.Token, notified, time.Hour)
		rec, err := replay(st, id)
		if err != nil || !bytes.Equal(rec.Body, resp.Body) || fmt.Sprint(rec.Header) != fmt.Sprint(resp.Header) {
			t.Errorf("sealed first %v: replay %v (err %v), want the plain response", sealedFirst, rec, err)
		}
	}
}
