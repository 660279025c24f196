package wire

import (
	"fmt"

	"github.com/google/uuid"
)

// IdentifyRequest is the optional first message of a connection (the server's
// IdentifyRequest, request type 14, fixed-size; docs/celeriant-protocol.md section
// 1.3): a 6-element array [correlation id, public key, nonce, signature, api key,
// known dict sha256], every field optional (nil when empty).
type IdentifyRequest struct {
	CorrelationID uuid.UUID
	PublicKey     string // base64 DER SubjectPublicKeyInfo of an RSA key; "" for API-key-only
	Nonce         string // decimal Unix epoch milliseconds, signed by the identity
	Signature     string // base64 RSASSA-PKCS1-v1_5 SHA-256 signature of Nonce
	APIKey        string // base64 of the 32-byte API key
	KnownDictSHA  string // hex SHA-256 of the compression dictionary the client holds
}

// IdentifyResponse answers an Identify (response type 16, variable-size, never
// compressed): [correlation id, client id, access level, dict sha256, dict bytes].
type IdentifyResponse struct {
	CorrelationID uuid.UUID
	ClientID      uuid.UUID // the verified identity's client id; uuid.Nil without one
	AccessLevel   uint8     // 1 read-write, 2 read-only, 0 absent (no API keys configured)
	DictSHA       string    // hex SHA-256 of the cluster's compression dictionary
	Dict          []byte    // the dictionary, nil when the client already holds DictSHA
}

func (e *Encoder) optStr(s string) {
	if s == "" {
		e.nil_()
		return
	}
	e.str(s)
}

// IdentifyRequest encodes an Identify request frame.
func (e *Encoder) IdentifyRequest(req *IdentifyRequest) []byte {
	e.begin()
	e.arr(6)
	e.optID(req.CorrelationID)
	for _, s := range []string{req.PublicKey, req.Nonce, req.Signature, req.APIKey, req.KnownDictSHA} {
		e.optStr(s)
	}
	return e.finish(ReqIdentify)
}

// IdentifyResponse encodes an Identify response frame. The dictionary is written as
// the server's library writes a byte vector: an array of integers.
func (e *Encoder) IdentifyResponse(res *IdentifyResponse) []byte {
	e.begin()
	e.arr(5)
	e.optID(res.CorrelationID)
	e.optID(res.ClientID)
	if res.AccessLevel == 0 {
		e.nil_()
	} else {
		e.u(uint64(res.AccessLevel))
	}
	e.optStr(res.DictSHA)
	if res.Dict == nil {
		e.nil_()
	} else {
		e.arr(len(res.Dict))
		for _, b := range res.Dict {
			e.u(uint64(b))
		}
	}
	return e.finish(RespIdentify)
}

func (x *Decoder) optStr() (string, error) {
	if isNil, err := x.isNil(); err != nil || isNil {
		return "", err
	}
	return x.str()
}

// IdentifyRequest decodes an Identify request body: 5 or 6 elements (the last one
// has a default on the server).
func (x *Decoder) IdentifyRequest(body []byte) (req IdentifyRequest, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(5, 6)
		if err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		fields := []*string{&req.PublicKey, &req.Nonce, &req.Signature, &req.APIKey, &req.KnownDictSHA}
		for _, p := range fields[:n-1] {
			if *p, err = x.optStr(); err != nil {
				return err
			}
		}
		return nil
	}()
	return req, wrapDecode("identify request", err)
}

// IdentifyResponse decodes an Identify response body. The dictionary may be an
// array of byte values (the server's form) or a bin.
func (x *Decoder) IdentifyResponse(body []byte) (res IdentifyResponse, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(3, -1)
		if err != nil {
			return err
		}
		if res.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if res.ClientID, err = x.optID(); err != nil {
			return err
		}
		level, err := x.optU()
		if err != nil {
			return err
		}
		if level != nil {
			if *level > 0xff {
				return fmt.Errorf("access level %d", *level)
			}
			res.AccessLevel = uint8(*level)
		}
		if n >= 4 {
			if res.DictSHA, err = x.optStr(); err != nil {
				return err
			}
		}
		if n >= 5 {
			if res.Dict, err = x.byteVec(); err != nil {
				return err
			}
		}
		return x.skip(n - min(n, 5))
	}()
	return res, wrapDecode("identify response", err)
}

// byteVec reads nil, a bin, or an array of integers 0-255.
func (x *Decoder) byteVec() ([]byte, error) {
	c, err := x.peek()
	if err != nil {
		return nil, err
	}
	switch c {
	case fmtNil:
		_, _ = x.r.ReadByte()
		return nil, nil
	case fmtBin8, fmtBin16, fmtBin32:
		return x.bin()
	}
	n, err := x.list(1)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, min(n, maxPrealloc))
	for range n {
		v, err := x.u()
		if err != nil {
			return nil, err
		}
		if v > 0xff {
			return nil, fmt.Errorf("byte value %d", v)
		}
		out = append(out, byte(v))
	}
	return out, nil
}
