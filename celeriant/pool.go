package celeriant

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// pool holds the connections to one address: sem has a slot taken per connection
// in use, at most Config.MaxConns; idle the pooled ones, the most recently used last.
type pool struct {
	sem  chan struct{}
	mu   sync.Mutex
	idle []*conn
}

// conn is one connection with its own encoder, decoder and read buffer; lastUsed
// is when it last went back to the pool.
type conn struct {
	nc       net.Conn
	enc      *wire.Encoder
	dec      *wire.Decoder
	buf      []byte
	lastUsed time.Time
}

// pool returns the pool of addr, made on first use.
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

// dial opens a connection to addr within Config.DialTimeout: TCP, then TLS when
// configured, then identify when an API key or identity is set. Every error wraps
// ErrNotSent; one that could not reach addr also unreachableError.
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
