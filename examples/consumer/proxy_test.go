package main

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// proxy forwards TCP connections to a broker; cut closes every connection and
// refuses new ones (closing each at once) until restore: to the client, a
// broker that went away and came back, without touching the shared broker.
type proxy struct {
	ln      net.Listener
	target  string
	refused chan struct{} // one value per connection refused while cut

	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, refused: make(chan struct{}, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.accept()
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.cut()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			select {
			case p.refused <- struct{}{}:
			default:
			}
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go pipe(c, up)
		go pipe(up, c)
	}
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut closes every forwarded connection and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// restore forwards new connections again.
func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// waitRefused waits until n connection attempts were refused while cut.
func (p *proxy) waitRefused(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for i := range n {
		select {
		case <-p.refused:
		case <-timeout:
			t.Fatalf("%d of %d connection attempts within a minute of the cut", i, n)
		}
	}
}
