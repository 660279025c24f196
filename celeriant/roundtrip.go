package celeriant

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/internal/sleep"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// Bounds of roundTrip's retries within one request.
const (
	// maxLeaderHops is how many not-leader answers naming a leader one request follows
	// in a row before it waits as in an election.
	maxLeaderHops = 3
	// maxBusyRetries is how many times one request is re-sent after a busy answer
	// (2012, 11000), waiting busyBackoff, then twice, four times as long.
	maxBusyRetries = 3
	busyBackoff    = 10 * time.Millisecond
	// maxElectionBackoff caps the wait between two tries while no leader can be
	// reached (an election, or a node that cannot be dialled).
	maxElectionBackoff = 200 * time.Millisecond
)

// roundTrip sends one request and reads its answer, with the retry rules of Client:
// once more on a fresh connection when a pooled one was dead (reads only); to the
// leader a not-leader answer names (writes too: the server refuses a write on a
// follower before any check, so it had no effect), up to maxLeaderHops in a row;
// after a busy answer, with a backoff, up to maxBusyRetries. While no leader can be
// reached (a not-leader answer that names none, more hops than maxLeaderHops, or an
// address that cannot be dialled, which moves the client to the next one; not a node
// that names itself) it backs
// off and tries again until the request's deadline: an election ends within the
// caller's budget, not after a fixed number of tries. None of these retries re-sends
// a request the server may have applied (docs/celeriant-protocol.md section 5).
func (c *Client) roundTrip(ctx context.Context, op string, isWrite bool, corr uuid.UUID, want wire.MessageType,
	encode func(*wire.Encoder) []byte, decode func(*wire.Decoder, []byte) (uuid.UUID, error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	hops, busy, waits, mayReuse := 0, 0, 0, true
	var answer *ServerError // the last not-leader answer, for an error the deadline cuts
	for {
		c.mu.Lock()
		closed, addr := c.closed, c.target
		c.mu.Unlock()
		if closed {
			return fmt.Errorf("%w: %w: %s", ErrNotSent, ErrClosed, op)
		}
		err, retry := c.attempt(ctx, addr, op, isWrite, mayReuse, corr, want, encode, decode)
		if err == nil {
			return nil
		}
		var se *ServerError
		if answer != nil && ctx.Err() != nil && !errors.As(err, &se) {
			// The deadline cut a retry short (not sent, or no answer): the caller
			// learns both, and that the cluster had no leader to take it.
			return fmt.Errorf("%w (the last answer before the deadline: %w)", err, answer)
		}
		leader, notLeader := IsNotLeader(err)
		if notLeader {
			errors.As(err, &answer)
		}
		switch {
		case notLeader && leader != "" && leader != addr && hops < maxLeaderHops:
			hops++
			c.mu.Lock()
			c.target = leader
			c.mu.Unlock()
			c.log.Debug("celeriant: following leader", "from", addr, "to", leader)
			continue
		case notLeader && leader != addr || unreachable(ctx, err):
			if c.electionBackoff(ctx, waits) != nil {
				return err
			}
			hops, waits = 0, waits+1
			continue
		case IsBusy(err) && busy < maxBusyRetries:
			if c.backoff(ctx, busy) != nil {
				return err
			}
			busy++
			continue
		case retry && mayReuse:
			mayReuse = false
			continue
		}
		return err
	}
}

// unreachableError marks a node that could not be dialled.
type unreachableError struct{ error }

func (e unreachableError) Unwrap() error { return e.error }

// unreachable reports a request that never left the process because its node could
// not be dialled (not a refused handshake, a cut frame or a closed client), while ctx
// still allows another try.
func unreachable(ctx context.Context, err error) bool {
	var ue unreachableError
	return ctx.Err() == nil && errors.As(err, &ue)
}

// backoff waits busyBackoff << n, or until ctx ends.
func (c *Client) backoff(ctx context.Context, n int) error { return sleep.Ctx(ctx, busyBackoff<<n) }

// electionBackoff waits before the n-th try to reach a leader again: busyBackoff
// doubling up to maxElectionBackoff, with the upper half jittered so that the
// clients of many replicas do not all come back at once, or until ctx ends.
func (c *Client) electionBackoff(ctx context.Context, n int) error {
	d := maxElectionBackoff
	if n < 5 {
		d = min(busyBackoff<<n, maxElectionBackoff)
	}
	return sleep.Ctx(ctx, d/2+mrand.N(d/2+1))
}

// attempt performs one request on one connection. retry reports a dead pooled
// connection on a read-only request, worth one more try on a fresh connection.
func (c *Client) attempt(ctx context.Context, addr, op string, isWrite, mayReuse bool, corr uuid.UUID, want wire.MessageType,
	encode func(*wire.Encoder) []byte, decode func(*wire.Decoder, []byte) (uuid.UUID, error)) (err error, retry bool) {
	p := c.pool(addr)
	cn, reused, err := c.acquire(ctx, p, addr, op, mayReuse)
	if err != nil {
		return err, false
	}
	healthy := false
	defer func() { c.release(p, cn, healthy) }()

	frame := encode(cn.enc)
	if n := len(frame) - wire.HeaderSize; int64(n) > int64(c.cfg.MaxRequestSize) {
		healthy = true
		return invalidf("%s: request body of %d bytes over the %d-byte limit", op, n, c.cfg.MaxRequestSize), false
	}
	dl, _ := ctx.Deadline()
	_ = cn.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = cn.nc.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		// Too late to stop: the deadline may be set after release, on a connection the
		// next request already uses. Drop it instead of pooling it.
		if !stop() {
			healthy = false
		}
	}()

	n, werr := cn.nc.Write(frame)
	if werr != nil {
		if n < len(frame) {
			return fmt.Errorf("%w: %s: %w", ErrNotSent, op, causeOf(ctx, werr)), false
		}
		return c.lost(ctx, op, isWrite, werr), false
	}
	h, body, rerr := wire.ReadFrame(cn.nc, cn.buf, func(h wire.Header) error {
		if h.Version != wire.ProtocolVersion { // the server answers in the request's version
			return errProtocolf("frame header: response version %d to a version %d request", h.Version, wire.ProtocolVersion)
		}
		return h.CheckResponse(c.cfg.MaxResponseSize)
	})
	cn.buf = body
	if rerr != nil {
		var ne net.Error
		timeout := errors.As(rerr, &ne) && ne.Timeout()
		retry = !isWrite && reused && ctx.Err() == nil && !timeout && !errors.Is(rerr, ErrProtocol)
		return c.lost(ctx, op, isWrite, rerr), retry
	}
	if body, rerr = c.dict.inflate(h, body, c.cfg.MaxResponseSize); rerr != nil {
		return c.lost(ctx, op, isWrite, rerr), false
	}
	err, healthy = c.answer(ctx, cn, h.Type, body, op, isWrite, corr, want, decode)
	return err, false
}

// answer decodes the response frame of type t: the server's error (a
// *ServerError), or the expected message type, whose correlation id must be
// corr. Anything else loses the connection (c.lost). healthy tells whether cn
// may go back to the pool.
func (c *Client) answer(ctx context.Context, cn *conn, t wire.MessageType, body []byte, op string, isWrite bool,
	corr uuid.UUID, want wire.MessageType, decode func(*wire.Decoder, []byte) (uuid.UUID, error)) (err error, healthy bool) {
	var got uuid.UUID
	switch t {
	case wire.RespError:
		ef, derr := cn.dec.ErrorResponse(body)
		if derr != nil {
			return c.lost(ctx, op, isWrite, derr), false
		}
		se := NewServerError(Code(ef.Code), ef.Message)
		se.CorrelationID = ef.CorrelationID
		// Accept an error without the echo (uuid.Nil): a connection-layer error path
		// may not know the request's correlation id.
		if se.CorrelationID != corr && se.CorrelationID != uuid.Nil {
			return c.lost(ctx, op, isWrite, errProtocolf("correlation id %s in answer to %s", se.CorrelationID, corr)), false
		}
		return se, true
	case want:
		if got, err = decode(cn.dec, body); err != nil {
			return c.lost(ctx, op, isWrite, err), false
		}
	default:
		return c.lost(ctx, op, isWrite, errProtocolf("response type %d to a %s", t, op)), false
	}
	if got != corr {
		return c.lost(ctx, op, isWrite, errProtocolf("correlation id %s in answer to %s", got, corr)), false
	}
	return nil, true
}

// failover moves later requests off addr after it could not be dialled: to the next
// address of Config.Addrs, or to the first one when addr was a leader learned from a
// not-leader answer. A follower there names the current leader (docs/celeriant-protocol.md section 5,
// 2011), so the client does not stay stuck on a dead leader.
func (c *Client) failover(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != addr {
		return
	}
	next := c.cfg.Addrs[0]
	for i, a := range c.cfg.Addrs {
		if a == addr {
			next = c.cfg.Addrs[(i+1)%len(c.cfg.Addrs)]
			break
		}
	}
	c.target = next
	c.log.Debug("celeriant: dialling the address failed, moving on", "from", addr, "to", next)
}

// causeOf names the context as the cause of an i/o error it provoked. Connection
// deadlines come only from the context, so an i/o timeout is its deadline even when the
// socket noticed before the context's own timer fired.
func causeOf(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

// lost is the error for a request that was sent completely and got no usable answer.
func (c *Client) lost(ctx context.Context, op string, isWrite bool, err error) error {
	if isWrite {
		return fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, op, causeOf(ctx, err))
	}
	return fmt.Errorf("%w: %s: %w", ErrTransport, op, causeOf(ctx, err))
}
