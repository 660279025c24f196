// Package encrypted wraps any store so that the responses it keeps are sealed
// with AES-256-GCM (crypto/aes, crypto/cipher): a dump of the store's tables
// or keys holds no byte of a stored body or header.
//
//	st, err := encrypted.New(pg, encrypted.Key{ID: "2026-12", Secret: secret})
//	...
//	m, err := middleware.New(st, ...)
//
// What is sealed, what stays in clear, and why (docs/stores.md, "Encrypted
// records"):
//
//   - Sealed: the body and every stored header. The wrapped store keeps the
//     body's ciphertext as the body (same length) and one header line,
//     SealedHeader, with the key id, the nonce, the headers' ciphertext and
//     the tag.
//   - In clear: the status and the omitted mark (operators read them with
//     Inspect), the body's length (GCM keeps lengths), the fingerprint (the
//     store compares it on every claim), the times, the lease and the token.
//     The status, the omitted mark, the body's length, the scope and the key
//     are bound to the sealed bytes as additional data: a record changed, or
//     copied under another scope, key or status, does not open.
//   - Each record names the id of the key that sealed it, and gets a fresh
//     random 96-bit nonce.
//
// Rotation: build the Store with the new key as current and the old ones
// after it. Records are sealed with the current key and opened with the key
// they name, so an old record keeps replaying until its retention ends; drop
// an old key only after that.
//
// A record that does not open (changed bytes, moved, a key id the Store was
// not given, written without the wrapper) is an error wrapping
// store.ErrCorrupt (ErrTampered, ErrUnknownKey): the middleware answers 503,
// never replays it and never runs the handler again for it.
//
// Wrap the outermost store: wrapping store/tiered seals what both of its tiers
// keep. A record completed inside the handler's own transaction (store/postgres
// CompleteTx) does not pass through the wrapper: seal its response with
// Store.Seal first, or it cannot be replayed, and write the plain response to
// the client yourself (store/postgres CommitResponse would write the sealed one).
package encrypted

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Store is a store.Store whose completed responses are sealed before the
// wrapped store keeps them and opened when it returns them. It also forwards
// the optional interfaces the middleware uses (store.Waiter, store.Pinger,
// store.Inspector, store.CompletionNotifier, store.InProcess) to the wrapped
// store. Safe for concurrent use.
type Store struct {
	st      store.Store
	current *sealer
	keys    map[string]*sealer
}

var (
	_ store.Store              = (*Store)(nil)
	_ store.Waiter             = (*Store)(nil)
	_ store.Pinger             = (*Store)(nil)
	_ store.Inspector          = (*Store)(nil)
	_ store.CompletionNotifier = (*Store)(nil)
	_ store.InProcess          = (*Store)(nil)
)

// New wraps st. current seals every new record; previous keys only open the
// records they sealed. Errors, at construction: a nil st (or a nil pointer in
// it), an empty or too-long key id, a secret that is not KeySize (32) bytes or
// is all zero bytes, two keys with one id or one secret.
func New(st store.Store, current Key, previous ...Key) (*Store, error) {
	if v := reflect.ValueOf(st); st == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, errors.New("idemkey/store/encrypted: nil store")
	}
	s := &Store{st: st, keys: make(map[string]*sealer, 1+len(previous))}
	secrets := make(map[string]string, 1+len(previous)) // secret to id
	for i, k := range append([]Key{current}, previous...) {
		if _, dup := s.keys[k.ID]; dup {
			return nil, fmt.Errorf("idemkey/store/encrypted: key id %q given twice", k.ID)
		}
		if other, dup := secrets[string(k.Secret)]; dup {
			return nil, fmt.Errorf("idemkey/store/encrypted: keys %q and %q have one secret (a rotation that rotates nothing)", other, k.ID)
		}
		secrets[string(k.Secret)] = k.ID
		sl, err := newSealer(k)
		if err != nil {
			if i == 0 {
				return nil, fmt.Errorf("current key: %w", err)
			}
			return nil, err
		}
		s.keys[k.ID] = sl
		if i == 0 {
			s.current = sl
		}
	}
	return s, nil
}

// Claim claims as the wrapped store does; a Completed answer carries the
// opened response, or the claim fails with ErrTampered or ErrUnknownKey.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.st.Claim(ctx, req)
	if err != nil || res.Outcome != store.Completed || res.Record == nil {
		return res, err
	}
	rec, err := s.open(req.ID, res.Record)
	if err != nil {
		return store.ClaimResult{}, err
	}
	res.Record = rec
	return res, nil
}

// Complete seals resp with the current key and completes id in the wrapped
// store. The arguments are checked first, as every store does (ErrInvalid).
// Each seal has a fresh nonce, so a completion repeated after its reply was
// lost is refused (store.ErrLeaseLost), where the wrapped store alone would
// answer it as done (docs/architecture.md section 4).
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	buf := getBuf()
	defer putBuf(buf) // the wrapped store copies what it keeps
	return s.st.Complete(ctx, id, token, s.current.seal(buf, id, resp), retention)
}

// Seal returns resp as the wrapper stores it for id: for a record completed
// without the wrapper (store/postgres CompleteTx), so that it replays. The
// result's Body is a new buffer.
func (s *Store) Seal(id store.ID, resp store.Response) store.Response {
	var buf []byte
	return s.current.seal(&buf, id, resp)
}

// Release forwards to the wrapped store.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	return s.st.Release(ctx, id, token)
}

// Renew forwards to the wrapped store.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	return s.st.Renew(ctx, id, token, lease)
}

// Wait forwards to the wrapped store; an error wrapping errors.ErrUnsupported
// when it cannot wait.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	w, ok := s.st.(store.Waiter)
	if !ok {
		return fmt.Errorf("idemkey/store/encrypted: the wrapped store cannot wait: %w", errors.ErrUnsupported)
	}
	return w.Wait(ctx, id)
}

// Ping checks the wrapped store (store.Ping).
func (s *Store) Ping(ctx context.Context) error { return store.Ping(ctx, s.st) }

// Inspect forwards to the wrapped store (a sealed body is as long as the
// body, and the omitted mark is in clear, so Info reads as without the
// wrapper).
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	in, ok := s.st.(store.Inspector)
	if !ok {
		return store.Info{}, fmt.Errorf("idemkey/store/encrypted: the wrapped store cannot inspect: %w", errors.ErrUnsupported)
	}
	return in.Inspect(ctx, id)
}

// Evict forwards to the wrapped store (see Inspect for what found reports).
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	in, ok := s.st.(store.Inspector)
	if !ok {
		return store.Info{}, false, fmt.Errorf("idemkey/store/encrypted: the wrapped store cannot evict: %w", errors.ErrUnsupported)
	}
	return in.Evict(ctx, id, policy)
}

// NotifyCompleted seals resp and forwards it to the wrapped store, when it
// keeps copies (store.CompletionNotifier; store/tiered). A resp that is
// already Seal's result for id (store/postgres CommitResponse hands the
// middleware the response it stored) is forwarded as it is: sealed twice, the
// copy would replay the sealed form.
func (s *Store) NotifyCompleted(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) {
	n, ok := s.st.(store.CompletionNotifier)
	if !ok || store.ValidateResponse(resp, retention) != nil {
		return
	}
	if _, err := s.open(id, &store.Record{Response: resp}); err == nil {
		n.NotifyCompleted(ctx, id, token, resp, retention)
		return
	}
	buf := getBuf()
	defer putBuf(buf)
	n.NotifyCompleted(ctx, id, token, s.current.seal(buf, id, resp), retention)
}

// InProcess reports whether the wrapped store answers without I/O: sealing
// adds no wait.
func (s *Store) InProcess() bool {
	p, ok := s.st.(store.InProcess)
	return ok && p.InProcess()
}

// open returns rec with its response opened for id.
func (s *Store) open(id store.ID, rec *store.Record) (*store.Record, error) {
	kid, rest, ok := keyID(rec)
	if !ok {
		return nil, ErrTampered
	}
	k := s.keys[string(kid)]
	if k == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownKey, kid)
	}
	resp, err := k.open(id, rec, rest)
	if err != nil {
		return nil, err
	}
	out := *rec
	out.Response = resp
	return &out, nil
}
