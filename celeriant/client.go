package celeriant

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/internal/sleep"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are node addresses (host:port, client port 10000 by default). Requests go to
	// the first one until a not-leader answer (2011/3005/4006) names the leader; from
	// then on they go to the leader. When the current address cannot be dialled, that
	// request fails with ErrNotSent and later ones go to the next address of Addrs (the
	// first one after a learned leader), whose not-leader answer names the new leader.
	Addrs []string
	// TLS, when set, wraps every connection in crypto/tls (docs/celeriant-protocol.md section 1.2).
	TLS *tls.Config
	// MaxConns caps the connections per address (each carries one request at a time,
	// docs/celeriant-protocol.md section 2.3); default 8. A request waits for a free connection.
	MaxConns int
	// IdleTimeout drops pooled connections idle this long; default 25 s, below the
	// server's 30 s idle close (docs/celeriant-protocol.md section 2.3). Must be in (0, 30 s).
	IdleTimeout time.Duration
	// DialTimeout bounds connecting (and the TLS handshake); default 5 s.
	DialTimeout time.Duration
	// RequestTimeout bounds a request whose context has no deadline; default 30 s.
	RequestTimeout time.Duration
	// MaxRequestSize caps a request body, in bytes; default 16 MiB (the server's default
	// limit). A larger request fails with ErrNotSent and ErrInvalidRequest.
	MaxRequestSize uint32
	// MaxResponseSize caps a response body, in bytes; default 64 MiB. A larger answer
	// fails the request like a lost answer (ErrTransport, or ErrOutcomeUnknown for a write).
	// Set it to at least the server's --max-response-size. The server itself never sends
	// a response over its limit: a read of a batch larger than that gets no answer and
	// ends at the deadline (docs/celeriant-protocol.md section 6.6).
	MaxResponseSize uint32
	// Now is the clock for idle eviction and the Identify nonce; default time.Now.
	Now func() time.Time
	// Dial replaces the TCP dialer (tests, proxies); default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives connection-level events at debug level; default discards.
	Logger *slog.Logger
	// APIKey, when set, is sent in an Identify handshake at the start of every
	// connection (docs/celeriant-protocol.md section 1.3), for a server with API keys
	// (or started with --require-client-identity, which answers 10004 to anything
	// else first): standard base64 of APIKeySize bytes, else New fails. A refused key
	// fails the request with ErrNotSent wrapping the *ServerError (10005-10007). After
	// Identify the server compresses large responses with its dictionary, which the
	// handshake delivers and the client applies. The key never appears in a log,
	// an error or a printed Config (Secret).
	APIKey Secret
	// Identity, when set, is an RSA key whose public half the server verifies in the
	// Identify handshake of every connection (docs/celeriant-protocol.md section 1.3):
	// the client signs the current Unix time in milliseconds (RSASSA-PKCS1-v1_5,
	// SHA-256), which the server accepts from 2 minutes old to 60 s ahead of its own
	// clock (10001 outside; 10002 for a bad signature). The server then binds the
	// connection to IdentityClientID of the key: every Write must carry it as its
	// ClientID (10003 otherwise). New fails for a key whose handshake would not fit a
	// fixed-size message (RSA keys over 2048 bits). LoadIdentity reads one from a file.
	// Both refusals fail the request with ErrNotSent wrapping the *ServerError.
	Identity *rsa.PrivateKey
}

// Client is a Celeriant client speaking protocol v3 (MessagePack) over TCP with a small
// connection pool. It implements EventStore and is safe for concurrent use. It never
// re-sends a write that was sent and got no answer (ErrOutcomeUnknown). Reads and
// AggregateDetails are retried once on a fresh connection when a pooled one turns out
// dead; every request follows a not-leader answer to the leader it names and is
// re-sent after a busy answer, both of which mean the server applied nothing
// (docs/celeriant-protocol.md section 5).
type Client struct {
	cfg    Config
	log    *slog.Logger
	corrHi uint64
	corrLo atomic.Uint64

	dict dictionary // the compression dictionary of an identified server

	mu     sync.Mutex
	target string
	pools  map[string]*pool
	closed bool
}

type pool struct {
	sem  chan struct{}
	mu   sync.Mutex
	idle []*conn
}

type conn struct {
	nc       net.Conn
	enc      *wire.Encoder
	dec      *wire.Decoder
	buf      []byte
	lastUsed time.Time
}

var _ EventStore = (*Client)(nil)

// New returns a Client for cfg. It does not connect; the first request does. It fails
// (a plain error) when Addrs is empty or IdleTimeout is 30 s or more.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("celeriant: Config.Addrs is empty")
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 8
	}
	if cfg.APIKey != "" {
		if err := checkAPIKey(cfg.APIKey); err != nil {
			return nil, err
		}
	}
	if cfg.Identity != nil {
		if err := checkIdentity(cfg.Identity, cfg.APIKey); err != nil {
			return nil, err
		}
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 25 * time.Second
	}
	if cfg.IdleTimeout >= 30*time.Second {
		return nil, fmt.Errorf("celeriant: IdleTimeout %v must be below the server's 30 s idle close", cfg.IdleTimeout)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.MaxRequestSize == 0 {
		cfg.MaxRequestSize = DefaultMaxRequestSize
	}
	if cfg.MaxResponseSize == 0 {
		cfg.MaxResponseSize = DefaultMaxResponseSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var seed [16]byte
	_, _ = rand.Read(seed[:])
	c := &Client{cfg: cfg, log: log, target: cfg.Addrs[0], pools: make(map[string]*pool)}
	c.corrHi = binary.BigEndian.Uint64(seed[:8])
	c.corrLo.Store(binary.BigEndian.Uint64(seed[8:]))
	return c, nil
}

// Dial returns a Client for addr after checking that it accepts a connection (kept in
// the pool). The error wraps ErrNotSent when it cannot connect.
func Dial(ctx context.Context, addr string) (*Client, error) {
	c, err := New(Config{Addrs: []string{addr}})
	if err != nil {
		return nil, err
	}
	cn, err := c.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	p := c.pool(addr)
	p.sem <- struct{}{}
	c.release(p, cn, true)
	return c, nil
}

// Close closes idle connections and makes further requests fail with ErrClosed (wrapped
// with ErrNotSent). Requests in progress finish and their connections are then closed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	pools := make([]*pool, 0, len(c.pools)) // a copy: pool() may add to the map meanwhile
	for _, p := range c.pools {
		pools = append(pools, p)
	}
	c.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		for _, cn := range p.idle {
			_ = cn.nc.Close()
		}
		p.idle = nil
		p.mu.Unlock()
	}
	return nil
}

// Leader returns the address requests currently go to.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.target
}

func (c *Client) pool(addr string) *pool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pools[addr]
	if p == nil {
		p = &pool{sem: make(chan struct{}, c.cfg.MaxConns)}
		c.pools[addr] = p
	}
	return p
}

func (c *Client) nextCorrelation() uuid.UUID {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[:8], c.corrHi)
	binary.BigEndian.PutUint64(u[8:], c.corrLo.Add(1))
	return u
}

// Write implements EventStore (docs/celeriant-protocol.md sections 4.3, 4.4). One round trip. Errors:
// *ServerError for a server answer; ErrOutcomeUnknown when the request was sent and no
// answer came (the write may have committed; it is never re-sent); ErrNotSent otherwise.
// A not-leader answer is followed to the named leader within the call, and a busy
// answer retried after a backoff (see roundTrip); both had no effect on the server.
func (c *Client) Write(ctx context.Context, req WriteRequest) (WriteResult, error) {
	if err := CheckWrite(&req); err != nil {
		return WriteResult{}, err
	}
	if req.CorrelationID == uuid.Nil {
		req.CorrelationID = c.nextCorrelation()
	}
	var res WriteResult
	err := c.roundTrip(ctx, "write", true, req.CorrelationID, wire.RespWrite,
		func(e *wire.Encoder) []byte { return e.WriteRequest(&req) },
		func(d *wire.Decoder, body []byte) (uuid.UUID, error) {
			var err error
			res, err = d.WriteResponse(body)
			return res.CorrelationID, err
		})
	return res, err
}

// Read implements EventStore (docs/celeriant-protocol.md sections 4.5, 4.6): one page. FromVersion 0 is
// sent as 1. Errors: *ServerError (1000 with MinimumAvailable, 1001, ...), ErrNotSent
// (including a request over 1007 bytes), ErrTransport.
func (c *Client) Read(ctx context.Context, req ReadRequest) (ReadResult, error) {
	req, err := CheckRead(req)
	if err != nil {
		return ReadResult{}, err
	}
	if req.CorrelationID == uuid.Nil {
		req.CorrelationID = c.nextCorrelation()
	}
	var res ReadResult
	err = c.roundTrip(ctx, "read", false, req.CorrelationID, wire.RespRead,
		func(e *wire.Encoder) []byte { return e.ReadRequest(&req) },
		func(d *wire.Decoder, body []byte) (uuid.UUID, error) {
			var err error
			res, err = d.ReadResponse(body)
			return res.CorrelationID, err
		})
	return res, err
}

// AggregateDetails implements EventStore (docs/celeriant-protocol.md section 4.7). A missing aggregate
// is a *ServerError with code 7001 (ErrNotFound); other errors as for Read.
func (c *Client) AggregateDetails(ctx context.Context, key AggregateKey) (AggregateDetails, error) {
	corr := c.nextCorrelation()
	var res AggregateDetails
	err := c.roundTrip(ctx, "aggregate details", false, corr, wire.RespAggregateDetails,
		func(e *wire.Encoder) []byte { return e.AggregateDetailsRequest(corr, key) },
		func(d *wire.Decoder, body []byte) (uuid.UUID, error) {
			var err error
			res, err = d.AggregateDetailsResponse(body)
			return res.CorrelationID, err
		})
	return res, err
}

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
		leader, notLeader := IsNotLeader(err)
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

// acquire takes a slot of p (waiting while p is at its connection limit) and an
// idle connection of p when mayReuse allows one that is still alive, or a new
// one dialled to addr. On an error the slot is given back and the error says
// whether the request was sent (ErrNotSent: never).
func (c *Client) acquire(ctx context.Context, p *pool, addr, op string, mayReuse bool) (cn *conn, reused bool, err error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, false, fmt.Errorf("%w: %s: waiting for a connection: %w", ErrNotSent, op, ctx.Err())
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed { // Close ran while this request waited for a connection
		<-p.sem
		return nil, false, fmt.Errorf("%w: %w: %s", ErrNotSent, ErrClosed, op)
	}
	cn, reused = c.idleConn(p, mayReuse)
	if cn != nil && c.cfg.TLS == nil && !alive(cn.nc) {
		_ = cn.nc.Close()
		cn, reused = nil, false
	}
	if cn == nil {
		if cn, err = c.dial(ctx, addr); err != nil {
			<-p.sem
			if ctx.Err() == nil {
				c.failover(addr)
			}
			return nil, false, fmt.Errorf("%s: %w", op, err)
		}
	}
	return cn, reused, nil
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
	c.log.Debug("celeriant: address unreachable, moving on", "from", addr, "to", next)
}

// alive reports whether a pooled plaintext connection is still open: a read with an
// expired deadline must time out (EOF means the server closed it, bytes mean desync).
func alive(nc net.Conn) bool {
	_ = nc.SetReadDeadline(time.Unix(1, 0))
	var b [1]byte
	n, err := nc.Read(b[:])
	if n > 0 {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// idleConn pops the most recently used idle connection younger than IdleTimeout,
// closing the stale ones.
func (c *Client) idleConn(p *pool, mayReuse bool) (*conn, bool) {
	if !mayReuse {
		return nil, false
	}
	now := c.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		cn := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(cn.lastUsed) < c.cfg.IdleTimeout {
			return cn, true
		}
		_ = cn.nc.Close()
	}
	return nil, false
}

func (c *Client) dial(ctx context.Context, addr string) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	nc, err := c.cfg.Dial(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrNotSent, addr, unreachableError{err})
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if c.cfg.TLS != nil {
		tc := tls.Client(nc, c.cfg.TLS)
		if err := tc.HandshakeContext(dctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("%w: tls handshake with %s: %w", ErrNotSent, addr, err)
		}
		nc = tc
	}
	cn := &conn{nc: nc, enc: wire.NewEncoder(), dec: wire.NewDecoder()}
	if c.cfg.APIKey != "" || c.cfg.Identity != nil {
		if err := c.identify(dctx, cn); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("%w: identify with %s: %w", ErrNotSent, addr, err)
		}
	}
	return cn, nil
}

// release returns cn to p's idle list when healthy (else closes it) and frees its slot.
// It reads c.closed under p.mu, which Close also takes after setting closed, so a
// connection is never pooled after Close has emptied the idle list.
func (c *Client) release(p *pool, cn *conn, healthy bool) {
	pooled := false
	if healthy {
		_ = cn.nc.SetDeadline(time.Time{})
		cn.lastUsed = c.cfg.Now()
		if cap(cn.buf) > 1<<20 {
			cn.buf = nil // do not keep a large page's buffer in the pool
		}
		p.mu.Lock()
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if !closed {
			p.idle = append(p.idle, cn)
			pooled = true
		}
		p.mu.Unlock()
	}
	if !pooled {
		_ = cn.nc.Close()
	}
	<-p.sem
}
