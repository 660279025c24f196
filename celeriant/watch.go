package celeriant

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// The watch messages (docs/celeriant-protocol.md section 4.9), aliases of the codec's types.
type (
	// WatchOperation is what a notification reports: WatchWrite (batches committed),
	// WatchCreate (an aggregate's first batch), WatchDelete, WatchTrimStart; the
	// server never fires WatchRead or WatchDetails.
	WatchOperation = wire.WatchOperation
	// WatchRequest subscribes to notifications: CorrelationID (echoed only in an
	// error), RequestedLatencyMs (nil: every notification at once; n: batch up to n
	// ms, at most the server's 2000 by default), ShardID (nil: routed by the
	// filters), and the filters Orgs, AggregateTypes, Aggregates and Operations
	// (empty = all; ANDed across filters, ORed within one).
	WatchRequest = wire.WatchRequest
	// WatchEvent is one notification: Key, Operation, FromVersion..ToVersion (Write;
	// several commits merged into one notification span several versions) and
	// KeepFromVersion (TrimStart); versions an operation does not carry are 0.
	WatchEvent = wire.WatchEvent
	// WatchResponse is one frame of the stream: Events, empty for the subscription's
	// acknowledgement and for a heartbeat.
	WatchResponse = wire.WatchResponse
)

// The operations of WatchEvent.Operation and WatchRequest.Operations, numbered as
// the server numbers them.
const (
	WatchDelete    = wire.WatchDelete
	WatchWrite     = wire.WatchWrite
	WatchRead      = wire.WatchRead
	WatchTrimStart = wire.WatchTrimStart
	WatchDetails   = wire.WatchDetails
	WatchCreate    = wire.WatchCreate
)

// WatchHeartbeat is how long the server stays silent on a watch without
// notifications before it sends an empty WatchResponse (docs/celeriant-protocol.md
// section 6.11).
const WatchHeartbeat = 5 * time.Second

// Watcher opens watch subscriptions. *Client and *celeriantsim.Sim implement it with
// the same semantics (docs/celeriant-protocol.md section 6.11): a subscription sees
// only what commits after the server acknowledged it (there is no "from version";
// read the aggregate to catch up), and a subscriber that falls 10,000 notifications
// behind is dropped by the server: its stream ends after what was already queued.
type Watcher interface {
	// Watch subscribes. It returns once the server acknowledged the subscription,
	// or with a *ServerError (8001 latency too high, 8005 too many subscribers,
	// 9001/9002 the filters do not route to one shard), or an error wrapping
	// ErrNotSent (nothing reached the server) or ErrTransport.
	Watch(ctx context.Context, req WatchRequest) (WatchStream, error)
}

// WatchStream is one subscription. Not safe for concurrent use, except Close.
type WatchStream interface {
	// Next blocks for the next frame: a WatchResponse with events, or an empty one
	// (a heartbeat). It fails with ctx's error when ctx ends (and closes the
	// stream: a frame may have been cut in the middle), with an error wrapping ErrTransport when the stream ended (the
	// server dropped a lagging subscriber, closed the connection, or sent nothing,
	// not even a heartbeat, for three heartbeat intervals), with a *ServerError the
	// server sent before ending it (8002-8004), or ErrClosed after Close.
	Next(ctx context.Context) (WatchResponse, error)
	// Close ends the subscription; the server drops it when it sees the connection
	// close.
	Close() error
}

var _ Watcher = (*Client)(nil)

// Watch opens a subscription on a connection of its own (a watch turns its
// connection into a one-way stream, docs/celeriant-protocol.md section 4.9), to the
// current target address (the leader once one is known). When the server answers
// 9001 or 9002 with its shard count and req has no ShardID, Watch opens one
// subscription per shard with ShardID set, as the server's own client does, and
// merges them. See Watcher for the errors.
func (c *Client) Watch(ctx context.Context, req WatchRequest) (WatchStream, error) {
	c.mu.Lock()
	addr, closed := c.target, c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: %w: watch", ErrNotSent, ErrClosed)
	}
	if req.CorrelationID == uuid.Nil {
		req.CorrelationID = c.nextCorrelation()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	s, err := c.watchOne(ctx, addr, &req)
	var se *ServerError
	if err == nil || req.ShardID != nil || !errors.As(err, &se) || se.NumShards == 0 ||
		(se.Code != CodeShardRoutingMultipleShards && se.Code != CodeShardRoutingIncompatible) {
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	// One subscription per shard, merged.
	m := &mergedWatch{frames: make(chan watchFrame, 1), done: make(chan struct{})}
	for shard := range se.NumShards {
		r := req
		r.ShardID = Version(shard)
		r.CorrelationID = c.nextCorrelation()
		s, err := c.watchOne(ctx, addr, &r)
		if err != nil {
			_ = m.Close()
			return nil, fmt.Errorf("watch of shard %d of %d: %w", shard, se.NumShards, err)
		}
		m.streams = append(m.streams, s)
	}
	for _, s := range m.streams {
		m.wg.Add(1)
		go m.pump(s)
	}
	return m, nil
}

// watchOne dials addr, sends req and waits for the acknowledgement.
func (c *Client) watchOne(ctx context.Context, addr string, req *WatchRequest) (*watchStream, error) {
	cn, err := c.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	frame := cn.enc.WatchRequest(req)
	if n := len(frame) - wire.HeaderSize; n > wire.MaxFixedBody {
		_ = cn.nc.Close()
		return nil, invalidf("watch: encoded request is %d bytes, over the %d-byte limit of a fixed-size message (too many ids?)", n, wire.MaxFixedBody)
	}
	dl, _ := ctx.Deadline()
	_ = cn.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = cn.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if n, err := cn.nc.Write(frame); err != nil {
		_ = cn.nc.Close()
		if n < len(frame) {
			return nil, fmt.Errorf("%w: watch: %w", ErrNotSent, causeOf(ctx, err))
		}
		return nil, fmt.Errorf("%w: watch: %w", ErrTransport, causeOf(ctx, err))
	}
	s := &watchStream{c: c, cn: cn, corr: req.CorrelationID}
	res, err := s.read()
	if err != nil {
		_ = cn.nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: watch: %w", ErrTransport, ctx.Err())
		}
		return nil, err
	}
	if len(res.Events) != 0 {
		// The server acknowledges with an empty frame; events first would mean a
		// stream this client does not understand.
		_ = cn.nc.Close()
		return nil, fmt.Errorf("%w: watch: %w", ErrTransport, errProtocolf("events before the acknowledgement"))
	}
	if !stop() {
		_ = cn.nc.Close()
		return nil, fmt.Errorf("%w: watch: %w", ErrTransport, ctx.Err())
	}
	_ = cn.nc.SetDeadline(time.Time{})
	return s, nil
}

// watchStream is one subscription on one connection.
type watchStream struct {
	c    *Client
	cn   *conn
	corr uuid.UUID

	mu     sync.Mutex
	closed bool
}

// read reads one frame: a WatchResponse, or an ErrorResponse as a *ServerError.
func (s *watchStream) read() (WatchResponse, error) {
	h, body, err := wire.ReadFrame(s.cn.nc, s.cn.buf, func(h wire.Header) error {
		if h.Version != wire.ProtocolVersion {
			return errProtocolf("frame header: response version %d to a version %d request", h.Version, wire.ProtocolVersion)
		}
		return h.CheckResponse(s.c.cfg.MaxResponseSize)
	})
	s.cn.buf = body
	if err != nil {
		return WatchResponse{}, fmt.Errorf("%w: watch: %w", ErrTransport, err)
	}
	if body, err = s.c.dict.inflate(h, body, s.c.cfg.MaxResponseSize); err != nil {
		return WatchResponse{}, fmt.Errorf("%w: watch: %w", ErrTransport, err)
	}
	switch h.Type {
	case wire.RespWatch:
		res, err := s.cn.dec.WatchResponse(body)
		if err != nil {
			return WatchResponse{}, fmt.Errorf("%w: watch: %w", ErrTransport, err)
		}
		return res, nil
	case wire.RespError:
		ef, err := s.cn.dec.ErrorResponse(body)
		if err != nil {
			return WatchResponse{}, fmt.Errorf("%w: watch: %w", ErrTransport, err)
		}
		se := NewServerError(Code(ef.Code), ef.Message)
		se.CorrelationID = ef.CorrelationID
		return WatchResponse{}, se
	}
	return WatchResponse{}, fmt.Errorf("%w: watch: %w", ErrTransport, errProtocolf("response type %d to a watch", h.Type))
}

// Next implements WatchStream. A frame must arrive within three heartbeat
// intervals.
func (s *watchStream) Next(ctx context.Context) (WatchResponse, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return WatchResponse{}, fmt.Errorf("watch: %w", ErrClosed)
	}
	_ = s.cn.nc.SetReadDeadline(time.Now().Add(3 * WatchHeartbeat))
	stop := context.AfterFunc(ctx, func() { _ = s.cn.nc.SetReadDeadline(time.Unix(1, 0)) })
	res, err := s.read()
	stopped := stop()
	if err == nil {
		return res, nil
	}
	s.mu.Lock()
	closed = s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return WatchResponse{}, fmt.Errorf("watch: %w", ErrClosed)
	case !stopped && ctx.Err() != nil:
		// A frame may have been cut in the middle: the stream cannot continue.
		_ = s.Close()
		return WatchResponse{}, fmt.Errorf("watch: %w", ctx.Err())
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = fmt.Errorf("%w: watch: no frame, not even a heartbeat, for %v", ErrTransport, 3*WatchHeartbeat)
	}
	_ = s.Close()
	return WatchResponse{}, err
}

// Close implements WatchStream.
func (s *watchStream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.cn.nc.Close()
}

// mergedWatch merges one subscription per shard.
type mergedWatch struct {
	streams []*watchStream
	frames  chan watchFrame
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	err     error // the first stream's end, set before frames is closed
}

type watchFrame struct {
	res WatchResponse
	err error
}

func (m *mergedWatch) pump(s *watchStream) {
	defer m.wg.Done()
	for {
		res, err := s.Next(context.Background())
		select {
		case m.frames <- watchFrame{res, err}:
		case <-m.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// Next implements WatchStream: the next frame of any shard; the first shard whose
// stream ends ends the merged stream (Close then closes the others).
func (m *mergedWatch) Next(ctx context.Context) (WatchResponse, error) {
	if m.err != nil {
		return WatchResponse{}, m.err
	}
	select {
	case f := <-m.frames:
		if f.err != nil {
			m.err = f.err
			_ = m.Close()
		}
		return f.res, f.err
	case <-m.done:
		return WatchResponse{}, fmt.Errorf("watch: %w", ErrClosed)
	case <-ctx.Done():
		return WatchResponse{}, fmt.Errorf("watch: %w", ctx.Err())
	}
}

// Close implements WatchStream.
func (m *mergedWatch) Close() error {
	m.once.Do(func() {
		close(m.done)
		for _, s := range m.streams {
			_ = s.Close()
		}
		m.wg.Wait()
	})
	return nil
}
