package wire

import (
	"fmt"

	"github.com/google/uuid"
)

// WatchOperation is the operation a watch event reports, as the server numbers it
// (docs/celeriant-protocol.md section 4.9).
type WatchOperation uint8

// The server's operation numbers (docs/celeriant-protocol.md section 4.9).
const (
	WatchDelete    WatchOperation = 0 // the aggregate was deleted
	WatchWrite     WatchOperation = 1 // batches committed: FromVersion..ToVersion
	WatchRead      WatchOperation = 2 // reserved by the server; never fired by it
	WatchTrimStart WatchOperation = 3 // soft trim: KeepFromVersion
	WatchDetails   WatchOperation = 4 // reserved by the server; never fired by it
	WatchCreate    WatchOperation = 5 // the aggregate's first batch (version 1) committed
)

// String names the operation as the server's code does ("Write", "Create", ...).
func (o WatchOperation) String() string {
	switch o {
	case WatchDelete:
		return "Delete"
	case WatchWrite:
		return "Write"
	case WatchRead:
		return "Read"
	case WatchTrimStart:
		return "TrimStart"
	case WatchDetails:
		return "AggregateDetails"
	case WatchCreate:
		return "Create"
	}
	return fmt.Sprintf("Operation(%d)", uint8(o))
}

// WatchRequest subscribes the connection to change notifications
// (docs/celeriant-protocol.md section 4.9). Each filter is nil (empty) for "match
// all"; the filters are ANDed, the ids within one are ORed.
type WatchRequest struct {
	// CorrelationID is echoed only in an ErrorResponse; uuid.Nil = absent.
	CorrelationID uuid.UUID
	// RequestedLatencyMs, when set, lets the server batch notifications for up to
	// that many milliseconds (at most the server's --max-requested-latency-ms,
	// default 2000, else 8001). nil: each notification is sent at once.
	RequestedLatencyMs *uint64
	// ShardID names the shard to watch; nil lets the server route by the filters
	// (docs/celeriant-protocol.md section 6.11).
	ShardID *uint64
	// Orgs, AggregateTypes and Aggregates filter by the key's parts.
	Orgs, AggregateTypes, Aggregates []uuid.UUID
	// Operations filters by operation.
	Operations []WatchOperation
}

// WatchEvent is one notification (the server's WatchResponseEvent): the aggregate and
// what happened to it. Versions are 0 when the operation carries none.
type WatchEvent struct {
	Key       AggregateKey
	Operation WatchOperation
	// FromVersion and ToVersion bound the versions committed (Write); several
	// commits of one aggregate merged into one notification span several versions.
	FromVersion, ToVersion uint64
	// KeepFromVersion is the trim point (TrimStart).
	KeepFromVersion uint64
}

// WatchResponse is one frame of the watch stream (type 8). The server sends one with
// no events as the subscription's acknowledgement and as a heartbeat after 5 s
// without notifications.
type WatchResponse struct {
	Events []WatchEvent
}

func (e *Encoder) idSet(ids []uuid.UUID) {
	if len(ids) == 0 {
		e.nil_()
		return
	}
	e.arr(len(ids))
	for _, id := range ids {
		e.id(id)
	}
}

// WatchRequest encodes a Watch request frame (type 6, a 7-element array,
// docs/celeriant-protocol.md section 4.9). The caller checks the 1007-byte limit.
func (e *Encoder) WatchRequest(req *WatchRequest) []byte {
	e.begin()
	e.arr(7)
	e.optID(req.CorrelationID)
	e.optU(req.RequestedLatencyMs)
	e.optU(req.ShardID)
	e.idSet(req.Orgs)
	e.idSet(req.AggregateTypes)
	e.idSet(req.Aggregates)
	if len(req.Operations) == 0 {
		e.nil_()
	} else {
		e.arr(len(req.Operations))
		for _, o := range req.Operations {
			e.u(uint64(o))
		}
	}
	return e.finish(ReqWatch)
}

func (e *Encoder) optVersion(v uint64) {
	if v == 0 {
		e.nil_()
		return
	}
	e.u(v)
}

// WatchResponse encodes a WatchResponse frame (type 8): [events], each event
// [org, type, id, operation, from, to, keep from] with 0 versions as nil.
func (e *Encoder) WatchResponse(res *WatchResponse) []byte {
	e.begin()
	e.arr(1)
	e.arr(len(res.Events))
	for i := range res.Events {
		ev := &res.Events[i]
		e.arr(7)
		e.id(ev.Key.Org)
		e.id(ev.Key.Type)
		e.id(ev.Key.ID)
		e.u(uint64(ev.Operation))
		e.optVersion(ev.FromVersion)
		e.optVersion(ev.ToVersion)
		e.optVersion(ev.KeepFromVersion)
	}
	return e.finish(RespWatch)
}

// idSet reads an optional set of ids (nil for absent; an empty set reads as nil too).
func (x *Decoder) idSet() ([]uuid.UUID, error) {
	if n, err := x.isNil(); n || err != nil {
		return nil, err
	}
	n, err := x.list(1)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, 0, min(n, maxPrealloc))
	for range n {
		id, err := x.id()
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (x *Decoder) operation() (WatchOperation, error) {
	v, err := x.u()
	if err != nil {
		return 0, err
	}
	if v > 0xff {
		return 0, fmt.Errorf("operation %d over u8", v)
	}
	return WatchOperation(v), nil
}

func (x *Decoder) optVersion() (uint64, error) {
	v, err := x.optU()
	if v == nil || err != nil {
		return 0, err
	}
	return *v, nil
}

// WatchRequest decodes a Watch request body, as strictly as the server (exactly 7
// elements).
func (x *Decoder) WatchRequest(body []byte) (req WatchRequest, err error) {
	x.reset(body, false)
	err = func() error {
		if _, err := x.arr(7, 7); err != nil {
			return err
		}
		if req.CorrelationID, err = x.optID(); err != nil {
			return err
		}
		if req.RequestedLatencyMs, err = x.optU(); err != nil {
			return err
		}
		if req.ShardID, err = x.optU(); err != nil {
			return err
		}
		for _, dst := range []*[]uuid.UUID{&req.Orgs, &req.AggregateTypes, &req.Aggregates} {
			if *dst, err = x.idSet(); err != nil {
				return err
			}
		}
		if n, err := x.isNil(); n || err != nil {
			return err
		}
		n, err := x.list(1)
		if err != nil {
			return err
		}
		req.Operations = make([]WatchOperation, 0, min(n, maxPrealloc))
		for range n {
			o, err := x.operation()
			if err != nil {
				return err
			}
			req.Operations = append(req.Operations, o)
		}
		return nil
	}()
	return req, wrapDecode("watch request", err)
}

// minWatchEventSize is the smallest encoding of a watch event: three integer ids,
// an operation and three nils.
const minWatchEventSize = 8

// WatchResponse decodes a WatchResponse body; extra trailing elements are skipped.
func (x *Decoder) WatchResponse(body []byte) (res WatchResponse, err error) {
	x.reset(body, false)
	err = func() error {
		n, err := x.arr(1, -1)
		if err != nil {
			return err
		}
		m, err := x.list(minWatchEventSize)
		if err != nil {
			return err
		}
		if m > 0 {
			res.Events = make([]WatchEvent, 0, min(m, maxPrealloc))
		}
		for range m {
			k, err := x.arr(7, -1)
			if err != nil {
				return err
			}
			var ev WatchEvent
			if ev.Key.Org, err = x.id(); err != nil {
				return err
			}
			if ev.Key.Type, err = x.id(); err != nil {
				return err
			}
			if ev.Key.ID, err = x.id(); err != nil {
				return err
			}
			if ev.Operation, err = x.operation(); err != nil {
				return err
			}
			if ev.FromVersion, err = x.optVersion(); err != nil {
				return err
			}
			if ev.ToVersion, err = x.optVersion(); err != nil {
				return err
			}
			if ev.KeepFromVersion, err = x.optVersion(); err != nil {
				return err
			}
			if err := x.skip(k - 7); err != nil {
				return err
			}
			res.Events = append(res.Events, ev)
		}
		return x.skip(n - 1)
	}()
	return res, wrapDecode("watch response", err)
}
