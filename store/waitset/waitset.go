// Package waitset fans the notifications of one connection out to the waiters of
// one process, by key, for the stores' store.Waiter implementations
// (store/postgres LISTEN, store/redis SUBSCRIBE): one connection per store
// however many requests wait, opened while someone waits and closed an idle
// period after the last one left. Poll is the waiter of stores without
// notifications: it re-checks the key with back-off.
package waitset

import (
	"context"
	"sync"
	"time"
)

// Listen runs one notification connection until ctx ends or the connection
// fails. It calls ready once, with nil as soon as notifications are delivered
// (or the error that kept it from listening), then set.Notify for each
// notification, and set.NotifyAll when notifications may have been lost (a
// reconnect). Its error is reported to Set.OnError unless ctx ended.
type Listen func(ctx context.Context, set *Set, ready func(error)) error

// Set is the waiters of one store. The zero value is not usable: set Listen.
type Set struct {
	// Listen runs the connection.
	Listen Listen
	// Idle is how long the connection stays open after the last waiter left;
	// 0 or less closes it at once.
	Idle time.Duration
	// OnError, when set, is told of a connection that failed.
	OnError func(err error)

	mu      sync.Mutex
	keys    map[string]*key
	waiters int
	run     *run
	idle    *time.Timer
	wg      sync.WaitGroup
}

type key struct {
	ch chan struct{} // closed by the key's notification
	n  int
}

type run struct {
	ready  chan struct{} // closed once listening or failed (err set)
	done   chan struct{} // closed when the connection is gone
	err    error
	cancel context.CancelFunc
}

// Wait registers for k's notification, makes sure the connection listens, then
// calls check (the store's own look at k, which may flag it as waited for).
// When check reports no live claim, Wait returns nil at once; otherwise it
// blocks until k's notification (nil), the connection's loss (nil: a
// notification may be lost), or ctx's end (ctx.Err()). Errors of the
// connection's start and of check are returned as they are.
func (s *Set) Wait(ctx context.Context, k string, check func(ctx context.Context) (live bool, err error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.keys == nil {
		s.keys = make(map[string]*key)
	}
	wk := s.keys[k]
	if wk == nil {
		wk = &key{ch: make(chan struct{})}
		s.keys[k] = wk
	}
	wk.n++
	s.waiters++
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	r := s.run
	if r == nil {
		r = s.start()
	}
	s.mu.Unlock()
	defer s.leave(k, wk)

	select {
	case <-r.ready:
		if r.err != nil {
			return r.err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	live, err := check(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	if !live {
		return nil
	}
	select {
	case <-wk.ch:
		return nil
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// start starts a connection. Called with s.mu held.
func (s *Set) start() *run {
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{ready: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	s.run = r
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var once sync.Once
		ready := func(err error) {
			once.Do(func() {
				r.err = err
				close(r.ready)
			})
		}
		err := s.Listen(ctx, s, ready)
		failed := ctx.Err() == nil
		ready(err) // a Listen that returned before calling it
		cancel()
		s.mu.Lock()
		if s.run == r {
			s.run = nil
		}
		s.mu.Unlock()
		if failed && err != nil && s.OnError != nil {
			s.OnError(err)
		}
		close(r.done)
	}()
	return r
}

// Notify wakes every waiter of k.
func (s *Set) Notify(k string) {
	s.mu.Lock()
	if wk := s.keys[k]; wk != nil {
		close(wk.ch)
		delete(s.keys, k)
	}
	s.mu.Unlock()
}

// NotifyAll wakes every waiter (notifications may have been lost).
func (s *Set) NotifyAll() {
	s.mu.Lock()
	for k, wk := range s.keys {
		close(wk.ch)
		delete(s.keys, k)
	}
	s.mu.Unlock()
}

// leave ends one waiter of k; the last waiter schedules the connection's close.
func (s *Set) leave(k string, wk *key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wk.n--
	if wk.n == 0 && s.keys[k] == wk {
		delete(s.keys, k)
	}
	s.waiters--
	if s.waiters > 0 || s.run == nil {
		return
	}
	r := s.run
	if s.Idle <= 0 {
		s.run = nil
		r.cancel()
		return
	}
	s.idle = time.AfterFunc(s.Idle, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.waiters == 0 && s.run == r {
			s.run, s.idle = nil, nil
			r.cancel()
		}
	})
}

// Stop closes the connection now, if open, and waits for it to end; waiters
// still waiting are woken, and a later Wait opens it again.
func (s *Set) Stop() {
	s.mu.Lock()
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	if s.run != nil {
		s.run.cancel()
		s.run = nil
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Stats returns the number of waiters and whether the connection is open (or
// opening).
func (s *Set) Stats() (waiters int, listening bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters, s.run != nil
}
