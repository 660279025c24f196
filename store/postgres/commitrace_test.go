package postgres

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// handClock runs the renewals when the test fires them.
type handClock struct {
	mu     sync.Mutex
	timers []*handTimer
}

type handTimer struct {
	c     *handClock
	f     func()
	armed bool
}

func (c *handClock) AfterFunc(_ time.Duration, f func()) claim.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &handTimer{c: c, f: f, armed: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *handTimer) Stop() bool { return t.set(false) }

func (t *handTimer) Reset(time.Duration) bool { return t.set(true) }

func (t *handTimer) set(armed bool) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = armed
	return was
}

// fire runs the armed timers on the caller's goroutine.
func (c *handClock) fire() {
	c.mu.Lock()
	var due []*handTimer
	for _, t := range c.timers {
		if t.armed {
			t.armed = false
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// slowProxy forwards TCP connections to target, delaying what the server sends
// by delay: the answers of one pool arrive late, the other pools' do not.
func slowProxy(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(delay) // the latency injected, not a synchronisation
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestCommitResponseNotCancelledByOwnRenewal: a renewal waiting on the row lock
// of the handler's CompleteTx finds the record completed the moment the commit
// releases it and reports the lease lost, which cancels the handler's context
// while the commit's answer is still on its way. The commit must not be
// abandoned then: CommitResponse reports success (not ErrCommitUnknown) for the
// commit that happened, and the retry replays it.
func TestCommitResponseNotCancelledByOwnRenewal(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	u, err := url.Parse(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = slowProxy(t, u.Host, 100*time.Millisecond)
	slow := newPool(t, u.String()) // the handler's pool; the store's answers at once
	clk := &handClock{}
	locked, proceed, errs := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		cl, _ := claim.FromContext(ctx)
		tx, err := slow.Begin(ctx)
		if err != nil {
			errs <- err
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		// Lock the record's row first, as CompleteTx will, so the renewal waits on it.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.qualified+` WHERE scope = $1 AND key = $2 FOR UPDATE`,
			[]byte(cl.ID.Scope), []byte(cl.ID.Key)); err != nil {
			errs <- err
			return
		}
		locked <- struct{}{}
		<-proceed
		err = s.CommitResponse(ctx, tx, w, store.Response{Status: 201, Body: []byte("committed")})
		errs <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})))
	defer srv.Close()
	post := func() (int, string) {
		r, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := make(chan int, 1)
	go func() { code, _ := post(); first <- code }()
	<-locked
	go clk.fire() // the renewal, on its own goroutine: it waits on the row lock
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%lease_until = now()%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal never waited on the row lock")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's state
	}
	close(proceed)
	if err := <-errs; err != nil {
		t.Fatalf("CommitResponse: %v; want success: the commit happened, only the renewal saw the record completed", err)
	}
	if code := <-first; code != 201 {
		t.Fatalf("first: %d", code)
	}
	if code, body := post(); code != 201 || body != "committed" {
		t.Fatalf("retry: %d %q, want the committed replay", code, body)
	}
}
