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
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

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
