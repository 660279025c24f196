package celeriant

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// Secret is a credential, such as Config.APIKey. It formats (fmt, %v, %s, %q, %#v),
// logs (slog) and marshals as text as "[redacted]", so a Config printed or logged
// whole never shows it; only the wire sees the value.
type Secret string

const redacted = "[redacted]"

// String returns "[redacted]".
func (Secret) String() string { return redacted }

// GoString returns "[redacted]".
func (Secret) GoString() string { return redacted }

// LogValue returns "[redacted]" for log/slog.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText returns "[redacted]" (encoding/json and friends).
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// AccessLevel is what an API key allows (the server's AccessLevel, in the Identify
// response): ReadWrite or ReadOnly; 0 when the server has no API keys.
type AccessLevel uint8

// The access levels of an API key.
const (
	ReadWrite AccessLevel = 1
	ReadOnly  AccessLevel = 2
)

// APIKeySize is the length of a Celeriant API key: 32 bytes, sent base64-encoded
// (docs/celeriant-protocol.md section 1.3).
const APIKeySize = 32

// checkAPIKey refuses a key the server could never accept (10006), so the
// misconfiguration fails at New. The error does not contain the key.
func checkAPIKey(k Secret) error {
	b, err := base64.StdEncoding.DecodeString(string(k))
	if err != nil {
		return errors.New("celeriant: Config.APIKey is not standard base64")
	}
	if len(b) != APIKeySize {
		return fmt.Errorf("celeriant: Config.APIKey decodes to %d bytes, want %d", len(b), APIKeySize)
	}
	return nil
}

// IdentityClientID returns the client id a Celeriant server derives from an RSA
// identity (docs/celeriant-protocol.md section 1.3): the first 16 bytes of the SHA-256
// of the key's DER SubjectPublicKeyInfo, read by the server as a little-endian u128,
// so the id's bytes (big-endian, as UUIDs travel) are those 16 bytes reversed.
// Writes on an identified connection must carry it as their ClientID.
func IdentityClientID(pub *rsa.PublicKey) (uuid.UUID, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return uuid.Nil, fmt.Errorf("celeriant: identity: %w", err)
	}
	sum := sha256.Sum256(der)
	var id uuid.UUID
	for i := range id {
		id[i] = sum[15-i]
	}
	return id, nil
}

// LoadIdentity reads an RSA private key for Config.Identity from a file: PEM
// ("PRIVATE KEY", PKCS#8, or "RSA PRIVATE KEY", PKCS#1), or the standard base64 of a
// PKCS#8 DER key, the form Celeriant's own key files use.
func LoadIdentity(path string) (*rsa.PrivateKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("celeriant: identity: %w", err)
	}
	der := raw
	if block, _ := pem.Decode(raw); block != nil {
		der = block.Bytes
	} else if der, err = base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw))); err != nil {
		return nil, fmt.Errorf("celeriant: identity %s: neither PEM nor base64", path)
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("celeriant: identity %s: %w", path, err)
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("celeriant: identity %s: a %T, want an RSA key", path, k)
	}
	return rk, nil
}

// checkIdentity refuses an RSA key the server cannot accept or whose Identify
// request (with a signature of the key's size and the longest nonce and dictionary
// hash) exceeds a fixed-size message, which the server would drop.
func checkIdentity(key *rsa.PrivateKey, apiKey Secret) error {
	if err := key.Validate(); err != nil {
		return fmt.Errorf("celeriant: Config.Identity: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("celeriant: Config.Identity: %w", err)
	}
	req := wire.IdentifyRequest{
		CorrelationID: uuid.Max,
		PublicKey:     base64.StdEncoding.EncodeToString(der),
		Nonce:         "99999999999999",
		Signature:     base64.StdEncoding.EncodeToString(make([]byte, key.Size())),
		APIKey:        string(apiKey),
		KnownDictSHA:  strings.Repeat("0", 64),
	}
	if n := len(wire.NewEncoder().IdentifyRequest(&req)) - wire.HeaderSize; n > wire.MaxFixedBody {
		return fmt.Errorf("celeriant: Config.Identity: a %d-bit key makes an Identify of %d bytes, over the server's %d-byte limit for it",
			key.N.BitLen(), n, wire.MaxFixedBody)
	}
	return nil
}

// identityFields returns the Identify fields of the configured RSA identity, signed
// now: the public key, the nonce and its signature; empty without an identity.
func (c *Client) identityFields() (pub, nonce, sig string, err error) {
	key := c.cfg.Identity
	if key == nil {
		return "", "", "", nil
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", "", err
	}
	nonce = strconv.FormatInt(c.cfg.Now().UnixMilli(), 10)
	digest := sha256.Sum256([]byte(nonce))
	raw, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, digest[:])
	if err != nil {
		return "", "", "", err
	}
	return base64.StdEncoding.EncodeToString(der), nonce, base64.StdEncoding.EncodeToString(raw), nil
}

// dictionary holds the cluster's compression dictionary, learned from an Identify
// response, and a decoder for responses compressed with it (shared by all
// connections; zstd.Decoder.DecodeAll is safe for concurrent use).
type dictionary struct {
	mu  sync.Mutex
	sha string
	dec *zstd.Decoder
}

func (d *dictionary) known() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sha
}

func (d *dictionary) set(sha string, dict []byte) error {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderDicts(dict))
	if err != nil {
		return errProtocolf("identify: compression dictionary: %v", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dec != nil {
		d.dec.Close()
	}
	d.sha, d.dec = sha, dec
	return nil
}

// inflate returns the body of a frame, decompressed when its header says zstd
// (compression 1). A compressed frame without a dictionary, one that does not
// decompress, or one whose size differs from the header's is ErrProtocol.
func (d *dictionary) inflate(h wire.Header, body []byte, max uint32) ([]byte, error) {
	if h.Compression == 0 {
		return body, nil
	}
	d.mu.Lock()
	dec := d.dec
	d.mu.Unlock()
	if dec == nil {
		return nil, errProtocolf("compressed response without Identify")
	}
	if h.UncompressedLength > max {
		return nil, errProtocolf("compressed response of %d bytes over the %d-byte limit", h.UncompressedLength, max)
	}
	out, err := dec.DecodeAll(body, make([]byte, 0, h.UncompressedLength))
	if err != nil || len(out) != int(h.UncompressedLength) {
		return nil, errProtocolf("compressed response: %d bytes, want %d (%v)", len(out), h.UncompressedLength, err)
	}
	return out, nil
}

// identify sends the Identify handshake on a new connection (docs/celeriant-protocol.md
// section 1.3) with the configured API key and RSA identity, checks the client id the
// server derived from the identity, and learns the compression dictionary the
// server will use on this connection's large responses. A refusal (10001-10007) is
// returned as the *ServerError (the server then closes the connection); nothing of a
// request was sent yet.
func (c *Client) identify(ctx context.Context, cn *conn) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = cn.nc.SetDeadline(dl)
		defer cn.nc.SetDeadline(time.Time{})
	}
	corr := c.nextCorrelation()
	pub, nonce, sig, err := c.identityFields()
	if err != nil {
		return fmt.Errorf("identify: %w", err)
	}
	frame := cn.enc.IdentifyRequest(&wire.IdentifyRequest{CorrelationID: corr, PublicKey: pub, Nonce: nonce, Signature: sig,
		APIKey: string(c.cfg.APIKey), KnownDictSHA: c.dict.known()})
	if _, err := cn.nc.Write(frame); err != nil {
		return fmt.Errorf("identify: %w", causeOf(ctx, err))
	}
	h, body, err := wire.ReadFrame(cn.nc, nil, func(h wire.Header) error { return h.CheckResponse(c.cfg.MaxResponseSize) })
	if err != nil {
		return fmt.Errorf("identify: %w", causeOf(ctx, err))
	}
	switch {
	case h.Compression != 0:
		return errProtocolf("identify: compressed answer")
	case h.Type == wire.RespError:
		ef, err := cn.dec.ErrorResponse(body)
		if err != nil {
			return err
		}
		se := NewServerError(Code(ef.Code), ef.Message)
		se.CorrelationID = ef.CorrelationID
		return se
	case h.Type != wire.RespIdentify:
		return errProtocolf("identify: answer of type %d", h.Type)
	}
	res, err := cn.dec.IdentifyResponse(body)
	if err != nil {
		return err
	}
	if res.CorrelationID != corr && res.CorrelationID != uuid.Nil {
		return errProtocolf("identify: correlation id %s in answer to %s", res.CorrelationID, corr)
	}
	if c.cfg.Identity != nil {
		if want, _ := IdentityClientID(&c.cfg.Identity.PublicKey); res.ClientID != want {
			return errProtocolf("identify: client id %s for an identity whose id is %s", res.ClientID, want)
		}
	}
	if res.Dict != nil {
		return c.dict.set(res.DictSHA, bytes.Clone(res.Dict))
	}
	return nil
}
