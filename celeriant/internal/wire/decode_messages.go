package wire

import (
	"fmt"
	"slices"

	"github.com/google/uuid"
)

// WriteRequest decodes a Write request body. Duplicate aggregate keys collapse, the
// last entry winning, as in the server's HashMap.
func (x *Decoder) WriteRequest(body []byte) (req WriteRequest, err error) {
	x.reset(body, true)
	err = func() error {
		if _, err := x.arr(4, 4); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.ClientID, err = x.id(); err != nil {
			return err
		}
		if req.UserID, err = x.optID(); err != nil {
			return err
		}
		n, err := x.mapLen()
		if err != nil {
			return err
		}
		if n < 0 || n > x.r.Len()/minEntrySize {
			return fmt.Errorf("writes map of %d entries in %d bytes", n, x.r.Len())
		}
		req.Writes = make([]AggregateWrite, 0, min(n, maxPrealloc))
		// Duplicate keys are found with an index past a few entries: a linear scan per
		// entry would let one 16 MiB request cost hours of CPU.
		var index map[AggregateKey]int
		if n > 8 {
			index = make(map[AggregateKey]int, min(n, maxPrealloc))
		}
		for i := 0; i < n; i++ {
			var w AggregateWrite
			if w.Key, err = x.key(); err != nil {
				return err
			}
			if _, err := x.arr(4, 4); err != nil {
				return err
			}
			if w.Events, err = x.events(true); err != nil {
				return err
			}
			if w.AllowCreate, err = x.bool(); err != nil {
				return err
			}
			if w.ExpectedVersion, err = x.optU(); err != nil {
				return err
			}
			if w.EnforceClientIdempotency, err = x.bool(); err != nil {
				return err
			}
			j, dup := -1, false
			if index != nil {
				j, dup = index[w.Key]
			} else {
				j = slices.IndexFunc(req.Writes, func(o AggregateWrite) bool { return o.Key == w.Key })
				dup = j >= 0
			}
			if dup {
				req.Writes[j] = w
				continue
			}
			if index != nil {
				index[w.Key] = len(req.Writes)
			}
			req.Writes = append(req.Writes, w)
		}
		return nil
	}()
	return req, wrapDecode("write request", err)
}

// ReadRequest decodes a Read request body.
func (x *Decoder) ReadRequest(body []byte) (req ReadRequest, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(3, 3); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.Key, err = x.key(); err != nil {
			return err
		}
		if _, err := x.arr(15, 15); err != nil {
			return err
		}
		f := &req.Filters
		if f.FromVersion, err = x.u(); err != nil {
			return err
		}
		if f.ToVersion, err = x.optU(); err != nil {
			return err
		}
		if isNil, err := x.isNil(); err != nil {
			return err
		} else if !isNil {
			n, err := x.list(1)
			if err != nil {
				return err
			}
			f.EventTypes = make([]uint64, n)
			for i := range f.EventTypes {
				if f.EventTypes[i], err = x.u(); err != nil {
					return err
				}
			}
		}
		for _, p := range []*uuid.UUID{&f.ExcludeClientID, &f.IncludeClientID, &f.ExcludeUserID, &f.IncludeUserID} {
			if *p, err = x.optID(); err != nil {
				return err
			}
		}
		for _, p := range []**uint64{&f.MinServerTimestamp, &f.MaxServerTimestamp, &f.MinClientSeq, &f.MaxClientSeq,
			&f.MinEventTimestamp, &f.MaxEventTimestamp, &f.MinEventSeq, &f.MaxEventSeq} {
			if *p, err = x.optU(); err != nil {
				return err
			}
		}
		return nil
	}()
	return req, wrapDecode("read request", err)
}

// AggregateDetailsRequest decodes an AggregateDetails request body.
func (x *Decoder) AggregateDetailsRequest(body []byte) (correlationID uuid.UUID, key AggregateKey, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(2, 2); err != nil {
			return err
		}
		if correlationID, err = x.optID(); err != nil {
			return err
		}
		key, err = x.key()
		return err
	}()
	return correlationID, key, wrapDecode("aggregate details request", err)
}

// WriteResponse decodes a WriteResponse body (a nil version becomes 0).
func (x *Decoder) WriteResponse(body []byte) (res WriteResult, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(2, -1)
		if err != nil {
			return err
		}
		if res.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		v, err := x.optU()
		if err != nil {
			return err
		}
		if v != nil {
			res.Version = *v
		}
		return x.skip(n - 2)
	}()
	return res, wrapDecode("write response", err)
}

// ReadResponse decodes a ReadResponse body (a nil next version becomes 0).
func (x *Decoder) ReadResponse(body []byte) (res ReadResult, err error) {
	x.reset(body, true)
	err = func() error {
		n, err := x.arr(3, -1)
		if err != nil {
			return err
		}
		if res.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		nb, err := x.list(minBatchSize)
		if err != nil {
			return err
		}
		res.Batches = make([]Batch, 0, min(nb, maxPrealloc))
		for range nb {
			res.Batches = append(res.Batches, Batch{})
			b := &res.Batches[len(res.Batches)-1]
			m, err := x.arr(5, -1)
			if err != nil {
				return err
			}
			if b.Version, err = x.u(); err != nil {
				return err
			}
			if b.ClientID, err = x.id(); err != nil {
				return err
			}
			if b.UserID, err = x.optID(); err != nil {
				return err
			}
			if b.ServerTimestamp, err = x.u(); err != nil {
				return err
			}
			if b.Events, err = x.events(false); err != nil {
				return err
			}
			if err := x.skip(m - 5); err != nil {
				return err
			}
		}
		v, err := x.optU()
		if err != nil {
			return err
		}
		if v != nil {
			res.NextVersion = *v
		}
		return x.skip(n - 3)
	}()
	return res, wrapDecode("read response", err)
}

// AggregateDetailsResponse decodes an AggregateDetailsResponse body.
func (x *Decoder) AggregateDetailsResponse(body []byte) (d AggregateDetails, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(10, -1)
		if err != nil {
			return err
		}
		if d.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		for _, p := range []*uint64{&d.MinVersion, &d.MaxVersion, &d.MaxEventSeq} {
			if *p, err = x.u(); err != nil {
				return err
			}
		}
		for _, p := range []*bool{&d.IsDeleted, &d.AllowRecreate, &d.AllowSequenceContinuation} {
			if *p, err = x.bool(); err != nil {
				return err
			}
		}
		if d.LastServerTimestamp, err = x.u(); err != nil {
			return err
		}
		if d.LastClientID, err = x.id(); err != nil {
			return err
		}
		if d.LastUserID, err = x.optID(); err != nil {
			return err
		}
		return x.skip(n - 10)
	}()
	return d, wrapDecode("aggregate details response", err)
}

// ErrorFrame is a decoded ErrorResponse (docs/celeriant-protocol.md section 4.8); package
// celeriant turns it into a *ServerError.
type ErrorFrame struct {
	CorrelationID uuid.UUID // uuid.Nil when absent
	Code          uint32    // the server's error_code
	Message       string    // the server's text, usually a small JSON object
}

// ErrorResponse decodes an ErrorResponse body.
func (x *Decoder) ErrorResponse(body []byte) (ErrorFrame, error) {
	x.reset(body, false)
	var (
		corr uuid.UUID
		code uint64
		msg  string
	)
	err := func() (err error) {
		n, err := x.arr(3, -1)
		if err != nil {
			return err
		}
		if corr, err = x.optID(); err != nil {
			return err
		}
		if code, err = x.u(); err != nil {
			return err
		}
		if code > 0xffffffff {
			return fmt.Errorf("error code %d over u32", code)
		}
		if msg, err = x.str(); err != nil {
			return err
		}
		return x.skip(n - 3)
	}()
	if err != nil {
		return ErrorFrame{}, wrapDecode("error response", err)
	}
	return ErrorFrame{CorrelationID: corr, Code: uint32(code), Message: msg}, nil
}
