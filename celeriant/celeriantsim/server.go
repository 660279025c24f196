package celeriantsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// ListenAndServe listens on addr (host:port; port 0 picks one) and serves the wire
// protocol in the background. It returns the listener; Close stops it.
func (s *Sim) ListenAndServe(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() { _ = s.Serve(ln) }()
	return ln, nil
}

// Serve accepts connections on ln and serves protocol v3 frames (docs/celeriant-protocol.md sections
// 2-4) until ln fails or the Sim is closed: one request at a time per connection,
// answered in order; a malformed frame, an unknown or unsupported message type (only
// AggregateDetails, Read, Write, TrimStart and Watch are served), protocol version 2, or IdleTimeout without
// a request closes the connection without an answer, like the server.
func (s *Sim) Serve(ln net.Listener) error { return s.serve(ln, -1) }

// serve is Serve for node (an index into a Cluster's nodes; -1 standalone).
func (s *Sim) serve(ln net.Listener, node int) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return celeriant.ErrClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			delete(s.listeners, ln)
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return celeriant.ErrClosed
			}
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return celeriant.ErrClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c, node)
	}
}

// Close stops every listener and connection served by Serve, commits the writes held
// by HoldNextWrite, and refuses further in-process calls with ErrNotSent/ErrClosed.
func (s *Sim) Close() error {
	s.mu.Lock()
	s.closed = true
	s.closeWatchersLocked()
	for h := range s.active {
		h.Commit()
	}
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// CloseConnections drops every open TCP connection (the listeners keep accepting), as
// a server restart or network blip would.
func (s *Sim) CloseConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
}

func (s *Sim) serveConn(c net.Conn, node int) {
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	var buf []byte
	check := func(h wire.Header) error {
		if err := h.CheckRequest(s.opts.MaxRequestSize); err != nil {
			return err
		}
		if h.Version != wire.ProtocolVersion {
			return fmt.Errorf("protocol version %d not simulated", h.Version)
		}
		if h.Compression != 0 {
			return errors.New("compressed requests not simulated")
		}
		return nil
	}
	ss := &session{s: s, c: c, node: node, enc: wire.NewEncoder(), dec: wire.NewDecoder()}
	for ; ; ss.n++ {
		_ = c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		h, body, err := wire.ReadFrame(c, buf, check)
		buf = body
		if err != nil {
			s.log.Debug("celeriantsim: closing connection", "remote", c.RemoteAddr(), "err", err)
			return
		}
		frame, next := ss.handle(h, body)
		switch next {
		case hangUp:
			return
		case skip:
			continue
		}
		if ss.write(frame) != nil {
			return
		}
	}
}

// action is what a connection does after a request.
type action int

const (
	reply  action = iota // write the answer, read the next request
	skip                 // nothing (more) to write, read the next request
	hangUp               // close the connection
)

// session is one TCP connection: its codec, what Identify established, and how many
// requests it has read.
type session struct {
	s    *Sim
	c    net.Conn
	node int // the Cluster node this connection reached; -1 standalone
	enc  *wire.Encoder
	dec  *wire.Decoder
	st   connState
	n    int
}

func (ss *session) write(frame []byte) error {
	_ = ss.c.SetWriteDeadline(time.Now().Add(ss.s.opts.IdleTimeout))
	_, err := ss.c.Write(frame)
	return err
}

// refuse writes a refusal: the error frame, then skip or hang up.
func (ss *session) refuse(corr uuid.UUID, serr *celeriant.ServerError, closeAfter bool) action {
	if ss.write(ss.enc.ErrorResponse(corr, uint32(serr.Code), serr.Message)) != nil || closeAfter {
		return hangUp
	}
	return skip
}

// gate applies the checks the server makes before serving a request (identity first,
// permissions): reply to serve it, else the refusal's action.
func (ss *session) gate(corr uuid.UUID, mutates bool) action {
	if serr, closeAfter := ss.s.admit(&ss.st, ss.n == 0, mutates); serr != nil {
		return ss.refuse(corr, serr, closeAfter)
	}
	return reply
}

// gateLeader is gate for a write (trim false) or trim by clientID: also 10003 when
// clientID is not the connection's verified identity, then 2011 or 3005 on a
// follower, the connection staying open.
func (ss *session) gateLeader(corr, clientID uuid.UUID, trim bool) action {
	if a := ss.gate(corr, true); a != reply {
		return a
	}
	if serr := mismatch(&ss.st, clientID); serr != nil {
		return ss.refuse(corr, serr, false)
	}
	if serr := ss.s.notLeader(ss.node, trim); serr != nil {
		return ss.refuse(corr, serr, false)
	}
	return reply
}

// handle serves one request frame. A body that does not decode, an Identify that is
// not the first request, and an unknown type hang up, as on the server.
func (ss *session) handle(h wire.Header, body []byte) ([]byte, action) {
	s, enc, ctx := ss.s, ss.enc, context.Background()
	bad := func(what string, err error) ([]byte, action) {
		s.log.Debug("celeriantsim: bad "+what+" request", "err", err)
		return nil, hangUp
	}
	switch h.Type {
	case wire.ReqIdentify:
		req, err := ss.dec.IdentifyRequest(body)
		if err != nil || ss.n > 0 {
			return bad("or late identify", err)
		}
		ok, serr := s.identify(&req, &ss.st)
		if serr != nil {
			return nil, ss.refuse(req.CorrelationID, serr, true)
		}
		return ok(enc), reply
	case wire.ReqWrite:
		req, err := ss.dec.WriteRequest(body)
		if err != nil {
			return bad("write", err)
		}
		if a := ss.gateLeader(req.CorrelationID, req.ClientID, false); a != reply {
			return nil, a
		}
		res, err, lost := s.serveWrite(ctx, &req)
		if lost {
			return nil, hangUp
		}
		return answer(enc, err, req.CorrelationID, func() []byte { return enc.WriteResponse(&res) }), reply
	case wire.ReqRead:
		req, err := ss.dec.ReadRequest(body)
		if err != nil {
			return bad("read", err)
		}
		return ss.read(&req)
	case wire.ReqAggregateDetails:
		corr, key, err := ss.dec.AggregateDetailsRequest(body)
		if err != nil {
			return bad("details", err)
		}
		if a := ss.gate(corr, false); a != reply {
			return nil, a
		}
		_ = s.wait(ctx)
		d, err := s.serveDetails(corr, key)
		return answer(enc, err, corr, func() []byte { return enc.AggregateDetailsResponse(&d) }), reply
	case wire.ReqTrimStart:
		req, err := ss.dec.TrimStartRequest(body)
		if err != nil {
			return bad("trim", err)
		}
		if a := ss.gateLeader(req.CorrelationID, req.ClientID, true); a != reply {
			return nil, a
		}
		_ = s.wait(ctx)
		err = s.Trim(req.Key, req.KeepFromVersion)
		return answer(enc, err, req.CorrelationID, func() []byte { return enc.TrimStartResponse(req.CorrelationID) }), reply
	case wire.ReqWatch:
		req, err := ss.dec.WatchRequest(body)
		if err != nil {
			return bad("watch", err)
		}
		if ss.gate(req.CorrelationID, false) == reply {
			s.serveWatch(ss.c, enc, &req, &ss.st)
		}
		return nil, hangUp
	}
	s.log.Debug("celeriantsim: message type not simulated", "type", h.Type)
	return nil, hangUp
}

// read serves a Read: no answer at all over MaxResponseSize (the server fails to
// write it, drops it and reads the next request), a large answer compressed on an
// identified connection.
func (ss *session) read(req *celeriant.ReadRequest) ([]byte, action) {
	if a := ss.gate(req.CorrelationID, false); a != reply {
		return nil, a
	}
	s, enc := ss.s, ss.enc
	_ = s.wait(context.Background())
	res, err := s.serveRead(req)
	frame := answer(enc, err, req.CorrelationID, func() []byte { return enc.ReadResponse(&res) })
	if len(frame)-wire.HeaderSize > s.opts.MaxResponseSize {
		s.log.Debug("celeriantsim: response over MaxResponseSize not sent", "bytes", len(frame)-wire.HeaderSize)
		return nil, skip
	}
	if err == nil {
		frame = compress(&ss.st, frame)
	}
	return frame, reply
}

func answer(enc *wire.Encoder, err error, corr uuid.UUID, ok func() []byte) []byte {
	if err == nil {
		return ok()
	}
	var se *celeriant.ServerError
	if errors.As(err, &se) {
		return enc.ErrorResponse(corr, uint32(se.Code), se.Message)
	}
	// Not reachable: the serve functions only return server errors.
	return enc.ErrorResponse(corr, uint32(celeriant.CodeServerBusy), "{}")
}

// serveWatch turns c into a watch stream (docs/celeriant-protocol.md section 4.9): an
// error frame and the end of the connection when the subscription is refused; else
// an empty WatchResponse as the acknowledgement, then one frame per notification (or
// merged window) and an empty one as a heartbeat. The stream ends, closing c without
// an error frame, when the subscriber is dropped for lagging, when the client sends
// anything or closes its side, or when a frame cannot be written within IdleTimeout.
func (s *Sim) serveWatch(c net.Conn, enc *wire.Encoder, req *celeriant.WatchRequest, cs *connState) {
	w, serr := s.subscribe(req)
	if serr != nil {
		_ = c.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
		_, _ = c.Write(enc.ErrorResponse(req.CorrelationID, uint32(serr.Code), serr.Message))
		return
	}
	st := &stream{s: s, w: w, done: make(chan struct{}), lastSend: time.Now()}
	defer st.Close()
	_ = c.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
	if _, err := c.Write(enc.WatchResponse(&celeriant.WatchResponse{})); err != nil {
		return
	}
	// The client only reads from here on: any byte, EOF or error means it is gone.
	go func() {
		var b [1]byte
		_ = c.SetReadDeadline(time.Time{})
		_, _ = c.Read(b[:])
		_ = st.Close()
	}()
	for {
		res, err := st.Next(context.Background())
		if err != nil {
			s.log.Debug("celeriantsim: watch stream ends", "remote", c.RemoteAddr(), "err", err)
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
		if _, err := c.Write(compress(cs, enc.WatchResponse(&res))); err != nil {
			return
		}
	}
}
