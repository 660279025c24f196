package celeriantsim

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/klauspost/compress/dict"
	"github.com/klauspost/compress/zstd"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// The server's messages for the Identify path (docs/celeriant-protocol.md section
// 1.3). They are plain sentences, not JSON.
const (
	msgIdentifyRequired = "Server requires client identity verification"
	msgAPIKeyRequired   = "API key required but not provided"
	msgAPIKeyFormat     = "Invalid API key format"
	msgAPIKeyLength     = "Invalid API key length"
	msgAPIKeyInvalid    = "Invalid API key"
	msgPermissions      = "Insufficient permissions for this operation"
	msgNonce            = "Nonce expired or too far in the future"
	msgSignature        = "Invalid signature"
)

// The nonce window the server accepts, around its own clock.
const (
	nonceMaxAge   = 2 * time.Minute
	nonceMaxAhead = 60 * time.Second
)

// compressThreshold is the body size from which the server compresses a
// variable-size response on an identified connection.
const compressThreshold = 1024

// connState is what a connection's Identify established.
type connState struct {
	identified bool
	level      celeriant.AccessLevel
	clientID   uuid.UUID // the verified RSA identity's client id; uuid.Nil without one
}

// identify answers an Identify request as the server's first-message handling does:
// with API keys configured, a missing key is 10005, one that is not base64 of 32
// bytes or not configured (unknown, or revoked by a rotation) 10006; else the
// IdentifyResponse with the access level and the compression dictionary (its bytes
// unless the client already holds them). A refusal closes the connection.
func (s *Sim) identify(req *wire.IdentifyRequest, st *connState) (frameFn func(*wire.Encoder) []byte, serr *celeriant.ServerError) {
	if req.PublicKey != "" && req.Nonce != "" && req.Signature != "" { // else no identity, as on the server
		id, serr := s.verifyIdentity(req)
		if serr != nil {
			return nil, serr
		}
		st.clientID = id
	}
	if len(s.opts.APIKeys) > 0 {
		if req.APIKey == "" {
			return nil, celeriant.NewServerError(celeriant.CodeAuthRequired, msgAPIKeyRequired)
		}
		raw, err := base64.StdEncoding.DecodeString(req.APIKey)
		switch {
		case err != nil:
			return nil, celeriant.NewServerError(celeriant.CodeAuthInvalidKey, msgAPIKeyFormat)
		case len(raw) != celeriant.APIKeySize:
			return nil, celeriant.NewServerError(celeriant.CodeAuthInvalidKey, msgAPIKeyLength)
		}
		level, ok := s.opts.APIKeys[req.APIKey]
		if !ok {
			return nil, celeriant.NewServerError(celeriant.CodeAuthInvalidKey, msgAPIKeyInvalid)
		}
		st.level = level
	}
	st.identified = true
	d := simDictionary()
	res := wire.IdentifyResponse{CorrelationID: req.CorrelationID, ClientID: st.clientID, AccessLevel: uint8(st.level), DictSHA: d.sha}
	if d.enc != nil && req.KnownDictSHA != d.sha {
		res.Dict = d.bytes
	}
	return func(enc *wire.Encoder) []byte { return enc.IdentifyResponse(&res) }, nil
}

// verifyIdentity checks an RSA identity as the server does: the nonce, a decimal
// Unix time in milliseconds, at most nonceMaxAhead after the simulator's clock and at
// most nonceMaxAge before it (else 10001), then the RSASSA-PKCS1-v1_5 SHA-256
// signature of the nonce by the DER SubjectPublicKeyInfo RSA key (else 10002). It
// returns the client id the server derives from the key.
func (s *Sim) verifyIdentity(req *wire.IdentifyRequest) (uuid.UUID, *celeriant.ServerError) {
	ms, err := strconv.ParseUint(strings.TrimPrefix(req.Nonce, "+"), 10, 64) // Rust's u64 parse takes one '+'
	now := uint64(max(s.opts.Now().UnixMilli(), 0))
	if err != nil || ms > now+uint64(nonceMaxAhead.Milliseconds()) || now > ms && now-ms > uint64(nonceMaxAge.Milliseconds()) {
		return uuid.Nil, celeriant.NewServerError(celeriant.CodeIdentifyInvalidNonce, msgNonce)
	}
	bad := celeriant.NewServerError(celeriant.CodeIdentifyInvalidSignature, msgSignature)
	der, err := base64.StdEncoding.DecodeString(req.PublicKey)
	if err != nil {
		return uuid.Nil, bad
	}
	key, err := x509.ParsePKIXPublicKey(der)
	pub, ok := key.(*rsa.PublicKey)
	if err != nil || !ok {
		return uuid.Nil, bad
	}
	sig, err := base64.StdEncoding.DecodeString(req.Signature)
	digest := sha256.Sum256([]byte(req.Nonce))
	if err != nil || rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig) != nil {
		return uuid.Nil, bad
	}
	id, err := celeriant.IdentityClientID(pub)
	if err != nil {
		return uuid.Nil, bad
	}
	return id, nil
}

// mismatch answers 10003 to a write or trim whose client id is not the connection's
// verified identity, as the server does before routing it, with the server's message
// (both ids as decimal u128s).
func mismatch(st *connState, clientID uuid.UUID) *celeriant.ServerError {
	if st.clientID == uuid.Nil || clientID == st.clientID {
		return nil
	}
	u128 := func(id uuid.UUID) string { return new(big.Int).SetBytes(id[:]).String() }
	return celeriant.NewServerError(celeriant.CodeIdentifyMismatch,
		fmt.Sprintf("client_id mismatch: request has %s, connection verified as %s", u128(clientID), u128(st.clientID)))
}

// admit applies the checks the server makes before serving a request: 10004 to a
// first request without Identify when identity is required (the connection then
// closes), 10007 to a write or trim on a read-only key (the connection stays).
func (s *Sim) admit(st *connState, first, mutates bool) (serr *celeriant.ServerError, closeAfter bool) {
	if first && !st.identified && s.opts.RequireIdentity {
		return celeriant.NewServerError(celeriant.CodeIdentifyRequired, msgIdentifyRequired), true
	}
	if mutates && st.level == celeriant.ReadOnly {
		return celeriant.NewServerError(celeriant.CodeAuthInsufficientPermissions, msgPermissions), false
	}
	return nil, false
}

// compress rewrites frame with a zstd body when the connection is identified and the
// body is compressThreshold bytes or more, as the server does for variable-size
// responses.
func compress(st *connState, frame []byte) []byte {
	body := frame[wire.HeaderSize:]
	if !st.identified || len(body) < compressThreshold || simDictionary().enc == nil {
		return frame
	}
	h, err := wire.ParseHeader(frame)
	if err != nil {
		return frame
	}
	z := simDictionary().enc.EncodeAll(body, nil)
	h.CompressedLength, h.Compression = uint32(len(z)), 1
	return append(wire.AppendHeader(nil, h), z...)
}

// simDict is the simulator's compression dictionary: our own, built once from
// sample account events (the server ships its own trained dictionary).
type simDict struct {
	bytes []byte
	sha   string
	enc   *zstd.Encoder
}

var (
	simDictOnce sync.Once
	simDictVal  *simDict
)

func simDictionary() *simDict {
	simDictOnce.Do(func() {
		var samples [][]byte
		for i := range 32 {
			samples = append(samples, fmt.Appendf(nil, `{"amountCents":%d,"accountId":"%08x-0000-4000-8000-%012x","type":"Deposited"}`, i*37, i*7919, i))
		}
		simDictVal = &simDict{} // without a dictionary nothing is compressed
		b, err := dict.BuildZstdDict(samples, dict.Options{MaxDictSize: 2048, HashBytes: 6, ZstdDictID: 0x5eed, ZstdLevel: zstd.SpeedFastest})
		if err != nil {
			return
		}
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderDict(b), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return
		}
		sum := sha256.Sum256(b)
		simDictVal = &simDict{bytes: b, sha: hex.EncodeToString(sum[:]), enc: enc}
	})
	return simDictVal
}
