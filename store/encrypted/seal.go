package encrypted

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// A sealed record, as the wrapped store keeps it:
//
//	Status       in clear
//	Body         AES-256-GCM ciphertext of the body: as long as the body
//	BodyOmitted  in clear
//	Header       one line, SealedHeader: base64 (standard, unpadded) of
//	             version (1 byte), key id length (1 byte), key id,
//	             nonce (12 random bytes), the ciphertext of the headers (in
//	             store/codec's encoding) and the 16-byte GCM tag
//
// The body and the headers are one GCM message (body, then headers), so the
// tag covers both. The additional data, never stored, binds the prefix
// (version and key id), the status, the omitted mark, the scope and the key:
// a record opens only under the ID and status it was sealed for. The body's
// ciphertext keeps the body's length, so the store's limits and Inspect's
// BodyBytes count the body as they do without the wrapper.
const (
	// SealedHeader is the one header line of a sealed record in the wrapped
	// store.
	SealedHeader = "Idemkey-Sealed"

	version  = 1
	overhead = 12 + 16 // nonce and tag
	// MaxKeyIDLen is the longest key id in bytes.
	MaxKeyIDLen = 255
	// KeySize is the length of a Key's Secret: AES-256.
	KeySize = 32
)

// Errors of a record that does not open. Both wrap store.ErrCorrupt, so the
// middleware answers 503 (fails closed): a record it cannot open is never
// replayed and never runs the handler again.
var (
	// ErrUnknownKey: the record names a key id the Store was not given (a key
	// retired before the records it sealed expired).
	ErrUnknownKey = fmt.Errorf("%w: sealed with an unknown key id", store.ErrCorrupt)
	// ErrTampered: the record is not a sealed record, or fails authentication
	// (changed bytes, or moved to another scope, key or status).
	ErrTampered = fmt.Errorf("%w: sealed record does not open", store.ErrCorrupt)
)

// Key is one AES-256 key of a Store's keyring.
type Key struct {
	// ID names the key in every record it seals: 1 to MaxKeyIDLen bytes, unique
	// in the keyring. It is stored in clear; choose a name, not a secret
	// ("2026-12").
	ID string
	// Secret is the AES-256 key: KeySize (32) random bytes.
	Secret []byte
}

// sealer is one key ready to seal and open.
type sealer struct {
	prefix []byte // version, id length, id
	aead   cipher.AEAD
}

func newSealer(k Key) (*sealer, error) {
	switch {
	case k.ID == "":
		return nil, errors.New("idemkey/store/encrypted: empty key id")
	case len(k.ID) > MaxKeyIDLen:
		return nil, fmt.Errorf("idemkey/store/encrypted: key id %q over %d bytes", k.ID, MaxKeyIDLen)
	case len(k.Secret) != KeySize:
		return nil, fmt.Errorf("idemkey/store/encrypted: key %q is %d bytes, want %d (AES-256)", k.ID, len(k.Secret), KeySize)
	}
	block, err := aes.NewCipher(k.Secret)
	if err != nil {
		return nil, fmt.Errorf("idemkey/store/encrypted: key %q: %w", k.ID, err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("idemkey/store/encrypted: key %q: %w", k.ID, err)
	}
	prefix := append([]byte{version, byte(len(k.ID))}, k.ID...)
	return &sealer{prefix: prefix, aead: aead}, nil
}

// buffers holds scratch buffers (plaintext, additional data, sealed output):
// a store copies what it keeps (store.Store.Complete), so each is free again
// once the call returns.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte { return buffers.Get().(*[]byte) }
func putBuf(b *[]byte) {
	if cap(*b) <= maxPooled {
		*b = (*b)[:0]
		buffers.Put(b)
	}
}

// maxPooled bounds the buffers kept for reuse: a rare large body is not
// held for the life of the process.
const maxPooled = 64 << 10

// additional appends the additional data of a record to dst.
func additional(dst, prefix []byte, id store.ID, status int, omitted bool) []byte {
	dst = append(dst, prefix...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(status))
	if omitted {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(id.Scope)))
	dst = append(dst, id.Scope...)
	return append(dst, id.Key...)
}

// seal returns resp as the wrapped store keeps it for id. Its Body is a slice
// of buf's storage (grown as needed), which the caller may reuse once the
// wrapped store returned.
func (s *sealer) seal(buf *[]byte, id store.ID, resp store.Response) store.Response {
	plain, aad := getBuf(), getBuf()
	defer putBuf(plain)
	defer putBuf(aad)
	*plain = append(append(*plain, resp.Body...), codec.EncodeHeader(resp.Header)...)
	*aad = additional(*aad, s.prefix, id, resp.Status, resp.BodyOmitted)
	out := s.aead.Seal((*buf)[:0], nil, *plain, *aad) // nonce, body, headers, tag
	*buf = out
	nb := len(resp.Body)
	line := *plain // free again: the line is prefix, nonce, the rest after the body
	line = append(append(append(line[:0], s.prefix...), out[:12]...), out[12+nb:]...)
	*plain = line
	sealedResp := store.Response{Status: resp.Status, BodyOmitted: resp.BodyOmitted,
		Header: http.Header{SealedHeader: {base64.RawStdEncoding.EncodeToString(line)}}}
	if nb > 0 {
		sealedResp.Body = out[12 : 12+nb]
	}
	return sealedResp
}

// keyID decodes the sealed header line of rec; it returns the key id and the
// rest (nonce, ciphertext of the headers, tag), or ok false when rec is not a
// sealed record of this version.
func keyID(rec *store.Record) (id, rest []byte, ok bool) {
	v := rec.Header[SealedHeader]
	if len(v) != 1 || len(rec.Header) != 1 {
		return nil, nil, false
	}
	b, err := base64.RawStdEncoding.DecodeString(v[0])
	if err != nil || len(b) < 2 || b[0] != version || len(b) < 2+int(b[1])+overhead {
		return nil, nil, false
	}
	return b[2 : 2+int(b[1])], b[2+int(b[1]):], true
}

// open returns the response of rec, sealed for id; rest is what keyID left.
func (s *sealer) open(id store.ID, rec *store.Record, rest []byte) (store.Response, error) {
	nb := len(rec.Body)
	msg := make([]byte, 0, len(rest)+nb)
	msg = append(append(append(msg, rest[:12]...), rec.Body...), rest[12:]...)
	aad := getBuf()
	defer putBuf(aad)
	*aad = additional(*aad, s.prefix, id, rec.Status, rec.BodyOmitted)
	p, err := s.aead.Open(msg[:0], nil, msg, *aad)
	if err != nil {
		return store.Response{}, ErrTampered
	}
	h, err := codec.DecodeHeader(string(p[nb:]))
	if err != nil {
		return store.Response{}, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	resp := store.Response{Status: rec.Status, Header: h, BodyOmitted: rec.BodyOmitted}
	if nb > 0 {
		resp.Body = p[:nb:nb]
	}
	return resp, nil
}
