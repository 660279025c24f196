package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idemclient "github.com/idemkey/idemkey/client"
)

// fault is what the proxy does to one attempt.
type fault int

const (
	pass        fault = iota
	resetBefore       // reset the client's connection before the request reaches the server
	resetAfter        // forward the request, reset the client's connection once the answer starts
	dropAnswer        // forward the request, read the whole answer, close the client's connection without it
)

var faultNames = [...]string{"pass", "reset-before", "reset-after", "drop-answer"}

// faultProxy is a TCP proxy in front of the fixture that reads one request per
// connection and applies the next fault planned for that logical request (told
// apart by its body); attempts beyond the plan pass.
type faultProxy struct {
	ln       net.Listener
	upstream string
	plan     func(logical string) []fault

	mu       sync.Mutex
	attempts map[string][]string // logical request -> the key of each attempt
	injected map[fault]int
}

func startProxy(t *testing.T, upstream string, plan func(string) []fault) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, upstream: upstream, plan: plan, attempts: map[string][]string{}, injected: map[fault]int{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(t, c.(*net.TCPConn)) })
		}
	})
	return p
}

// reset closes c with a TCP RST (linger 0), as a crashed peer or middlebox does.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func (p *faultProxy) serve(t *testing.T, c *net.TCPConn) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	logical := string(body)
	p.mu.Lock()
	n := len(p.attempts[logical])
	p.attempts[logical] = append(p.attempts[logical], req.Header.Get("Idempotency-Key"))
	f := pass
	if plan := p.plan(logical); n < len(plan) {
		f = plan[n]
	}
	p.injected[f]++
	p.mu.Unlock()
	if f == resetBefore {
		reset(c)
		return
	}
	u, err := net.Dial("tcp", p.upstream)
	if err != nil {
		t.Errorf("proxy: %v", err)
		return
	}
	defer u.Close()
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.Close = true
	if err := req.Write(u); err != nil {
		t.Errorf("proxy: forwarding: %v", err)
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(u), req)
	if err != nil {
		t.Errorf("proxy: reading the answer: %v", err)
		return
	}
	defer resp.Body.Close()
	switch f {
	case resetAfter: // the handler ran and answered; the answer dies on the way
		reset(c)
	case dropAnswer: // the whole answer arrived at the proxy and goes nowhere
		io.Copy(io.Discard, resp.Body)
	default:
		resp.Write(c)
	}
}

// TestClientKeepsKeyThroughFaults drives the fixture over TCP through a proxy
// that resets connections and loses answers, with the client package's
// transport: every logical request keeps one key across its attempts and
// succeeds, and the fixture's handler ran exactly once per logical request.
// A 422 (the key reused for another body) is returned without a retry.
func TestClientKeepsKeyThroughFaults(t *testing.T) {
	const logical = 16
	base := startServer(t, map[string]string{})
	plans := [][]fault{
		{resetAfter, dropAnswer},
		{dropAnswer},
		{resetBefore, resetAfter},
		{},
		{dropAnswer, resetBefore, dropAnswer},
	}
	plan := func(body string) []fault {
		var i int
		if n, _ := fmt.Sscanf(body, "deposit-%d", &i); n != 1 {
			return nil
		}
		return plans[i%len(plans)]
	}
	p := startProxy(t, strings.TrimPrefix(base, "http://"), plan)
	tr, err := idemclient.New(
		// One connection per attempt, so each attempt meets its own fault.
		idemclient.WithBase(&http.Transport{DisableKeepAlives: true}),
		idemclient.WithMaxAttempts(6),
		idemclient.WithBackoff(5*time.Millisecond, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr, Timeout: time.Minute}
	proxied := "http://" + p.ln.Addr().String()

	if n := counter(t, base); n != 0 {
		t.Fatalf("counter %d before the test", n)
	}
	for i := range logical {
		body := fmt.Sprintf("deposit-%d", i)
		resp, err := c.Post(proxied+"/echo", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 || string(got) != body {
			t.Errorf("%s: %d %q, want 201 and the body", body, resp.StatusCode, got)
		}
	}
	if n := counter(t, base); n != logical {
		t.Errorf("the handler ran %d times for %d logical requests", n, logical)
	}

	p.mu.Lock()
	seen := map[string]string{}
	for l, keys := range p.attempts {
		if want := len(plan(l)) + 1; len(keys) < want {
			t.Errorf("%s: %d attempts, want at least %d (one per planned fault, then one that passes)", l, len(keys), want)
		}
		for _, k := range keys {
			if k != keys[0] || k == "" {
				t.Errorf("%s: attempts carried keys %q, want one", l, keys)
				break
			}
		}
		if other, dup := seen[keys[0]]; dup {
			t.Errorf("%s and %s share the key %s", l, other, keys[0])
		}
		seen[keys[0]] = l
	}
	t.Logf("%d logical requests, faults injected: %s=%d %s=%d %s=%d, passed %d",
		len(p.attempts), faultNames[resetBefore], p.injected[resetBefore], faultNames[resetAfter], p.injected[resetAfter],
		faultNames[dropAnswer], p.injected[dropAnswer], p.injected[pass])
	p.mu.Unlock()

	// The same key for another body: 422 on the first attempt, no retry, no run.
	for i, body := range []string{"deposit-reused", "deposit-other"} {
		req, _ := http.NewRequest("POST", proxied+"/echo", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", `"reused"`)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := []int{201, 422}[i]; resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", body, resp.StatusCode, want)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.attempts["deposit-other"]); n != 1 {
		t.Errorf("the 422 was sent %d times, want once", n)
	}
	if n := counter(t, base); n != logical+1 {
		t.Errorf("counter %d after the reused key, want %d", n, logical+1)
	}
}
