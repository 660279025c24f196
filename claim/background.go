package claim

import (
	"context"
	"sync"
)

// background counts a Claimer's store work off the callers' paths: completions
// retried after their one attempt (Execution.Complete) and the queue of
// background releases (release.go), so a program can wait for it (Wait).
type background struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; made by the first waiter
}

func (b *background) add() {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
}

func (b *background) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n--; b.n == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
}

// Wait waits until the store work cl does in the background has ended:
// completions retried after their one attempt (Execution.Complete, at most a
// lease each) and claims released in the background (release.go; retried while
// the store fails, for six leases, at least a minute). It returns nil then, or
// ctx's error when ctx is done first. Call it on shutdown, after the server has
// stopped taking requests and its handlers returned (http.Server.Shutdown),
// before closing the store: work cut short when the program exits leaves its
// keys claimed until their leases end, and a result still pending then is not
// stored (the next request runs it again).
func (cl *Claimer) Wait(ctx context.Context) error {
	b := &cl.work
	b.mu.Lock()
	if b.n == 0 {
		b.mu.Unlock()
		return nil
	}
	if b.idle == nil {
		b.idle = make(chan struct{})
	}
	idle := b.idle
	b.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
