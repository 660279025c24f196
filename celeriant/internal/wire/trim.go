package wire

import "github.com/google/uuid"

// TrimStartRequest is a soft trim (the server's TrimStartRequest, request type 4,
// docs/celeriant-protocol.md section 6.7): reads below KeepFromVersion then give 1000.
// On the wire a 5-element array [correlation id, key, keep from version, client id,
// user id]; fixed-size.
type TrimStartRequest struct {
	CorrelationID   uuid.UUID    // echoed; uuid.Nil is sent as nil
	Key             AggregateKey // the aggregate to trim
	KeepFromVersion uint64       // the first version that stays readable
	ClientID        uuid.UUID    // the trimming client (required by the server's struct)
	UserID          uuid.UUID    // uuid.Nil = absent
}

// TrimStartRequest encodes a TrimStart request frame.
func (e *Encoder) TrimStartRequest(req *TrimStartRequest) []byte {
	e.begin()
	e.arr(5)
	e.optID(req.CorrelationID)
	e.key(req.Key)
	e.u(req.KeepFromVersion)
	e.id(req.ClientID)
	e.optID(req.UserID)
	return e.finish(ReqTrimStart)
}

// TrimStartResponse encodes a TrimStartResponse frame (type 4): [correlation id].
func (e *Encoder) TrimStartResponse(correlationID uuid.UUID) []byte {
	e.begin()
	e.arr(1)
	e.optID(correlationID)
	return e.finish(RespTrimStart)
}

// TrimStartRequest decodes a TrimStart request body, as strictly as the server: an
// array of exactly 5 elements.
func (x *Decoder) TrimStartRequest(body []byte) (req TrimStartRequest, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(5, 5); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.Key, err = x.key(); err != nil {
			return err
		}
		if req.KeepFromVersion, err = x.u(); err != nil {
			return err
		}
		if req.ClientID, err = x.id(); err != nil {
			return err
		}
		req.UserID, err = x.optID()
		return err
	}()
	return req, wrapDecode("trim start request", err)
}
