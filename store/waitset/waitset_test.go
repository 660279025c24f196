package waitset

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeConn is a Listen whose notifications the test sends.
type fakeConn struct {
	opened, closed atomic.Int32
	fail           error // returned by the next start
	lose           chan error
}

func (f *fakeConn) listen(ctx context.Context, _ *Set, ready func(error)) error {
	if f.fail != nil {
		return f.fail
	}
	f.opened.Add(1)
	defer f.closed.Add(1)
	ready(nil)
	select {
	case <-ctx.Done():
		return nil
	case err := <-f.lose:
		return err
	}
}

func live(context.Context) (bool, error) { return true, nil }

func TestWaitSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeConn{lose: make(chan error)}
		var reported atomic.Int32
		s := &Set{Idle: time.Second, OnError: func(error) { reported.Add(1) }}
		s.Listen = f.listen
		ctx, cancel := context.WithCancel(t.Context())
		errs := map[string]chan error{"a": make(chan error, 3), "b": make(chan error, 3)}
		for k, ch := range errs {
			for range 3 {
				go func() { ch <- s.Wait(ctx, k, live) }()
			}
		}
		synctest.Wait()
		if n, on := s.Stats(); n != 6 || !on || f.opened.Load() != 1 {
			t.Fatalf("6 waiters: stats %d %v, %d connections opened; want one", n, on, f.opened.Load())
		}
		s.Notify("a")
		for range 3 {
			if err := <-errs["a"]; err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if len(errs["b"]) != 0 {
			t.Fatal("a notification of key a woke a waiter of key b")
		}
		// The connection is lost: the remaining waiters wake (nil), the error is
		// reported, and the next Wait opens a new connection.
		f.lose <- errors.New("reset")
		for range 3 {
			if err := <-errs["b"]; err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if reported.Load() != 1 {
			t.Fatalf("%d failures reported", reported.Load())
		}
		done := make(chan error, 1)
		go func() { done <- s.Wait(ctx, "c", live) }()
		synctest.Wait()
		if f.opened.Load() != 2 {
			t.Fatalf("%d connections opened, want a second after the loss", f.opened.Load())
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait = %v", err)
		}
		// Idle: the connection stays a second after the last waiter, then closes.
		synctest.Wait()
		if _, on := s.Stats(); !on || f.closed.Load() != 1 {
			t.Fatalf("closed before the idle period")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n, on := s.Stats(); n != 0 || on || f.closed.Load() != 2 {
			t.Fatalf("after the idle period: %d waiters, listening %v, %d closed", n, on, f.closed.Load())
		}
	})
}

func TestWaitSetCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeConn{lose: make(chan error)}
		s := &Set{Listen: f.listen}
		if err := s.Wait(t.Context(), "k", func(context.Context) (bool, error) { return false, nil }); err != nil {
			t.Fatalf("no live claim: %v, want nil at once", err)
		}
		boom := errors.New("boom")
		if err := s.Wait(t.Context(), "k", func(context.Context) (bool, error) { return false, boom }); !errors.Is(err, boom) {
			t.Fatalf("failed check: %v", err)
		}
		f.fail = errors.New("refused")
		synctest.Wait()
		if err := s.Wait(t.Context(), "k", live); !errors.Is(err, f.fail) {
			t.Fatalf("connection refused: %v", err)
		}
		synctest.Wait()
		if n, on := s.Stats(); n != 0 || on {
			t.Fatalf("stats %d %v after every Wait returned (Idle 0)", n, on)
		}
		s.Stop()
	})
}
