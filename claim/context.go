package claim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Claim is the claim an execution runs under. Code whose side effect lives in
// the same database as the store completes the record inside its own transaction
// with it (store/postgres CompleteTx and CommitResponse), so the record and the
// side effect commit together (docs/architecture.md section 9).
type Claim struct {
	// ID is the scope and idempotency key.
	ID store.ID
	// Token is the fencing token the claim holds: a completion under it succeeds
	// only while no other request has taken the key over.
	Token store.Token
	// Fingerprint is the request's fingerprint (package fingerprint).
	Fingerprint store.Fingerprint
	// Takeover is set when the previous holder's lease expired and this execution
	// took the key over: the previous execution's side effects may already have
	// happened (unless they were fenced by the token in the same transaction).
	Takeover bool
	// Retention is what Store.Complete would be given: how long the record is kept
	// and replayed (the Claimer's, or SetRetention's once called).
	Retention time.Duration
	// CompleteTimeout bounds one completion of the record (the Claimer's
	// Timeouts.Complete; zero when the claim was made without a Claimer). A
	// completion in the caller's own transaction whose context has no deadline
	// (the middleware's handler context is detached from the client's) is bounded
	// by it (store/postgres CommitResponse), so a hung store is answered within the bound.
	CompleteTimeout time.Duration
}

// ErrNoClaim is returned by MarkCompleted when the context carries no claim: the
// request was not protected, passed through without a key, ran unprotected
// (fail open), or its execution has already returned.
var ErrNoClaim = errors.New("idemkey/claim: no idempotency claim in the context")

// ErrOneTx is returned by MarkCompleted in the one-transaction mode (TxStore):
// the record commits with the execution's own transaction when it returns, so
// there is nothing for the caller to complete, and a record it completed in
// another transaction would not be the one the mode commits.
var ErrOneTx = errors.New("idemkey/claim: MarkCompleted in the one-transaction mode: the record commits with the execution's transaction")

type ctxKey struct{}

// Context is a context carrying a claim and its execution; callers embed it in
// the context they hand to the execution (one allocation with theirs) and set it
// with Set. Its Value answers FromContext and MarkCompleted, and passes every
// other key on to the parent.
//
// Over a parent that is never cancelled (Done returns nil, as
// context.WithoutCancel's), c cancels itself when a renewal finds the lease lost:
// Done is closed, Err is context.Canceled and context.Cause(c) is
// store.ErrLeaseLost, with no allocation until then (Done makes its channel when
// first called). Over a parent that may be cancelled, c reports the parent's
// cancellation, and the caller cancels that parent on a lost lease (Execution.Start's
// lost, with context.WithCancelCause).
type Context struct {
	context.Context
	claim Claim
	exec  *Execution // nil without a claim (fail open: only the ID is set)

	self     bool // the parent is never cancelled, or c is detached from it: c cancels itself on a lost lease
	detached bool // SetDetached: the parent's values without its cancellation or deadline
	mu       sync.Mutex
	done     chan struct{}                   // made by the first Done
	lost     atomic.Pointer[context.Context] // set on a lost lease: a context cancelled with cause store.ErrLeaseLost
}

// Set makes c a context over parent carrying cl, executed by e (nil when the
// execution runs without a claim: then only cl.ID is meaningful, and
// FromContext reports no claim). Call it before Execution.Start, once per c.
func (c *Context) Set(parent context.Context, cl Claim, e *Execution) {
	c.Context, c.claim, c.exec = parent, cl, e
	c.self = e != nil && parent.Done() == nil
	if c.self {
		e.hctx = c
	}
}

// SetDetached is Set over the values of parent but none of its cancellation
// or deadline, as Set(context.WithoutCancel(parent), cl, e) without allocating
// the detached context: c is cancelled only when a renewal finds the lease lost
// (context.Cause then store.ErrLeaseLost); before that Done is never closed,
// Err and context.Cause are nil and Deadline reports none, whatever parent's.
// (Value passes package context's own keys on to parent, as every other key:
// context.Cause asks Err first, and a child context finds that c's Done is not
// the parent's, so neither reports the parent's cancellation.)
func (c *Context) SetDetached(parent context.Context, cl Claim, e *Execution) {
	c.Context, c.claim, c.exec = parent, cl, e
	c.self, c.detached = true, true
	if e != nil {
		e.hctx = c
	}
}

// Deadline is none when c is detached (SetDetached), else the parent's.
func (c *Context) Deadline() (time.Time, bool) {
	if c.detached {
		return time.Time{}, false
	}
	return c.Context.Deadline()
}

// ID returns the scope and key c carries.
func (c *Context) ID() store.ID { return c.claim.ID }

// Value returns c for this package's key, else the parent's value (after a lost
// lease, through a context cancelled with cause store.ErrLeaseLost, which is
// how context.Cause finds it).
func (c *Context) Value(k any) any {
	if k == (ctxKey{}) {
		return c
	}
	if l := c.lost.Load(); l != nil {
		return (*l).Value(k)
	}
	return c.Context.Value(k)
}

// Done is closed when the lease is lost (see Context), or is the parent's.
func (c *Context) Done() <-chan struct{} {
	if !c.self {
		return c.Context.Done()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.lost.Load() != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err is context.Canceled once the lease is lost (see Context), or the parent's.
func (c *Context) Err() error {
	if !c.self {
		return c.Context.Err()
	}
	if c.lost.Load() != nil {
		return context.Canceled
	}
	return nil
}

// loseLease cancels c with cause store.ErrLeaseLost, once.
func (c *Context) loseLease() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost.Load() != nil {
		return
	}
	parent := c.Context
	if c.detached { // a parent cancelled already would give lc its own cause
		parent = context.WithoutCancel(parent)
	}
	lc, cancel := context.WithCancelCause(parent)
	cancel(store.ErrLeaseLost)
	c.lost.Store(&lc)
	if c.done != nil {
		close(c.done)
	}
}

// NewContext returns a context over parent carrying cl, executed by e.
func NewContext(parent context.Context, cl Claim, e *Execution) context.Context {
	c := &Context{}
	c.Set(parent, cl, e)
	return c
}

// FromContext returns the claim the execution whose context ctx is (or derives
// from) runs under. ok is false when it runs without one (see ErrNoClaim).
func FromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(ctxKey{}).(*Context)
	if !ok || c.exec == nil {
		return Claim{}, false
	}
	cl := c.claim
	if d, ok := c.exec.retentionOf(c.claim); ok {
		cl.Retention = d
	}
	return cl, true
}

// MarkCompleted tells the execution that the caller completed the claim's
// record itself with resp, inside its own transaction, which has committed
// (store/postgres CompleteTx): the execution then neither completes nor releases
// the claim. A store that keeps a copy of records (store.CompletionNotifier,
// store/tiered) is told after the execution returns. resp must not be modified
// afterwards. Call it before the execution returns; ErrNoClaim when ctx carries
// no claim or the execution has returned; ErrOneTx in the one-transaction mode
// (middleware.Middleware.OneTx, idem.Runner.DoTx), whose record commits with the
// execution's transaction: nothing is marked, the execution ends as it would
// have.
func MarkCompleted(ctx context.Context, resp store.Response) error {
	c, ok := ctx.Value(ctxKey{}).(*Context)
	if !ok || c.exec == nil {
		return ErrNoClaim
	}
	e := c.exec
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if e.token != c.claim.Token || e.id != c.claim.ID || e.returned {
		return ErrNoClaim
	}
	if e.tx != nil {
		return ErrOneTx
	}
	e.inTx, e.txResp = true, resp
	return nil
}
