package celeriant

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
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
// section 1.3) with the configured API key, and learns the compression dictionary the
// server will use on this connection's large responses. A refusal (10001-10007) is
// returned as the *ServerError (the server then closes the connection); nothing of a
// request was sent yet.
func (c *Client) identify(ctx context.Context, cn *conn) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = cn.nc.SetDeadline(dl)
		defer cn.nc.SetDeadline(time.Time{})
	}
	corr := c.nextCorrelation()
	frame := cn.enc.IdentifyRequest(&wire.IdentifyRequest{CorrelationID: corr, APIKey: string(c.cfg.APIKey), KnownDictSHA: c.dict.known()})
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
	if res.Dict != nil {
		return c.dict.set(res.DictSHA, bytes.Clone(res.Dict))
	}
	return nil
}
