// Package tiered is an idempotency store (store.Store) made of a cache fast path (tiered.Cache; store/redis is one) in
// front of an authoritative backstop, normally store/postgres (docs/architecture.md section 4,
// "Tiered"). The cache answers what it holds; the backstop decides everything else.
//
//   - Claim asks the cache first (store/redis Peek: one GET, and a PTTL for a
//     marker). A completed record with the request's fingerprint is replayed, a
//     completed record of another fingerprint is a Mismatch, and a live in-flight
//     marker with the same fingerprint is InFlight: no backstop call.
//   - Anything else goes to the backstop's Claim, and only a backstop claim lets the
//     handler run: a record missing from the cache is never taken as new. A backstop
//     claim writes an in-flight marker to the cache (expiring with the lease); a
//     backstop replay backfills the cache with the record.
//   - Complete writes the backstop first (token-fenced there), then completes the
//     cache marker with the remaining retention. Release and Renew go to the
//     backstop, which decides, then (when it agreed) to the cache, token-checked and
//     best effort.
//   - Every cache call has a short timeout (WithTimeout, default 50 ms). A cache
//     error or timeout degrades that call to the backstop alone; it is counted
//     (Stats) and reported to the observer (WithObserver). After an error the fast
//     path (peeks, markers, backfills, renewals) is skipped for a cooldown
//     (WithCooldown, default 500 ms) and then tried again, so it resumes by itself
//     when the cache is back: after a restart, within about a second plus the cooldown
//     (go-redis waits that long before redialling a pool whose dials all failed).
//     Backstop errors are the store's errors (the middleware
//     answers 503).
//
// What the cache can get wrong is bounded and never causes a second execution or a
// wrong replay: completed records reach the cache only after the backstop accepted
// them, and completed records never change. A marker whose Release or Complete did
// not reach the cache (it was down) answers InFlight until its lease runs out. The cache's
// evictions, flushes and failovers only cost fast-path hits.
//
// With store/redis as the cache, give the go-redis client ContextTimeoutEnabled: true, so the timeout also bounds
// socket reads; without it a hung (not dead) cache blocks a call up to the client's
// ReadTimeout.
package tiered

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// Defaults of the options.
const (
	// DefaultTimeout bounds each cache call (WithTimeout).
	DefaultTimeout = 50 * time.Millisecond
	// DefaultCooldown is how long the fast path is skipped after a cache error
	// (WithCooldown).
	DefaultCooldown = 500 * time.Millisecond
)

// ErrFastTimeout marks a fast-path error caused by the cache timeout (WithTimeout)
// in Event.Err; the store itself never returns it.
var ErrFastTimeout = errors.New("idemkey/store/tiered: redis timeout")

// Cache is the fast path in front of the backstop: it answers what it holds and
// never decides a claim. *redis.Store (module github.com/idemkey/idemkey/store/redis)
// and *memory.Store (an in-process copy, docs/stores.md section 5.4) implement
// it. Errors are the cache client's; the tiered store degrades to the backstop
// on any of them.
type Cache interface {
	// Peek answers, without changing anything, what the cache alone can answer for
	// a request with fingerprint fp: Completed (with the record), InFlight (a live
	// marker of the same fingerprint) or Mismatch (completed for another
	// fingerprint). ok is false when the cache cannot decide.
	Peek(ctx context.Context, id store.ID, fp store.Fingerprint) (res store.ClaimResult, ok bool, err error)
	// Mark writes an in-flight marker held by token (issued by the backstop) that
	// expires with lease on the cache's clock.
	Mark(ctx context.Context, id store.ID, fp store.Fingerprint, token store.Token, lease time.Duration) error
	// Fill copies a completed record the backstop returned, unless the key already
	// holds a record or a marker; it expires after ttl.
	Fill(ctx context.Context, id store.ID, rec *store.Record, ttl time.Duration) error
	// Complete, Release and Renew act on a marker written by Mark with the same
	// token, as the store.Store methods of the same names do.
	Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error
	Release(ctx context.Context, id store.ID, token store.Token) error
	Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error
}

// Store is the tiered store. Build it with New; it is safe for concurrent use.
type Store struct {
	fast     Cache
	backstop store.Store
	timeout  time.Duration
	cooldown time.Duration
	observe  func(Event)
	// inProcess is set when the cache answers without I/O (store.InProcess,
	// store/memory): its calls get no timeout.
	inProcess bool

	downUntil atomic.Int64 // monotonic nanoseconds since start; fast path skipped before it
	start     time.Time
	stats     counters
	health    health // outage state, logged once per outage (health.go)
}

var (
	_ store.Store              = (*Store)(nil)
	_ store.CompletionNotifier = (*Store)(nil)
	_ store.Waiter             = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithTimeout bounds every cache call (default DefaultTimeout; 0: the default; a
// negative value makes New fail). A cache that answers without I/O
// (store.InProcess, as *memory.Store) is called without it.
func WithTimeout(d time.Duration) Option {
	return func(s *Store) { s.timeout = cmp.Or(d, DefaultTimeout) }
}

// WithCooldown sets how long the fast path is skipped after a cache error (default
// DefaultCooldown); 0 retries the cache on every call, a negative value makes New
// fail.
func WithCooldown(d time.Duration) Option {
	return func(s *Store) { s.cooldown = d }
}

// WithObserver registers f, called synchronously for every fast-path event (see
// Event). It must be fast and must not block; metrics hooks count here.
func WithObserver(f func(Event)) Option { return func(s *Store) { s.observe = f } }

// New returns a tiered store: fast answers what it holds, backstop (the
// authoritative store, e.g. *postgres.Store) decides. New does no I/O. Both are
// required: a nil one, or a nil pointer in the interface (say, a *redis.Store
// variable never assigned), or a negative WithTimeout or WithCooldown, is an error
// wrapping store.ErrInvalid, never a panic or a failure at the first request. Without a cache, use the backstop alone.
func New(fast Cache, backstop store.Store, opts ...Option) (*Store, error) {
	switch {
	case isNil(fast):
		return nil, fmt.Errorf("idemkey/store/tiered: %w: nil cache (use the backstop alone instead)", store.ErrInvalid)
	case isNil(backstop):
		return nil, fmt.Errorf("idemkey/store/tiered: %w: nil backstop", store.ErrInvalid)
	}
	s := &Store{fast: fast, backstop: backstop, timeout: DefaultTimeout, cooldown: DefaultCooldown, start: time.Now()}
	if ip, ok := fast.(store.InProcess); ok && ip.InProcess() {
		s.inProcess = true
	}
	for _, o := range opts {
		o(s)
	}
	if s.timeout < 0 || s.cooldown < 0 {
		return nil, fmt.Errorf("idemkey/store/tiered: %w: WithTimeout %v, WithCooldown %v: neither may be negative", store.ErrInvalid, s.timeout, s.cooldown)
	}
	return s, nil
}

// isNil reports whether v is nil or holds a nil pointer, map, slice, channel or
// function.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// EventKind classifies fast-path events.
type EventKind uint8

const (
	// FastAnswer: the cache answered the claim (replay, in flight or mismatch); the
	// backstop was not asked.
	FastAnswer EventKind = iota + 1
	// FastMiss: the cache could not answer the claim; the backstop decided.
	FastMiss
	// FastError: a cache call failed or timed out (Event.Err); the operation went
	// on with the backstop alone.
	FastError
	// FastSkipped: a fast-path read or marker write was skipped, cooling down
	// after an error.
	FastSkipped
	// Backfill: a record the backstop replayed was copied into the cache.
	Backfill
)

// String returns the kind's name ("fast_answer", ...), usable as a metrics label.
func (k EventKind) String() string {
	switch k {
	case FastAnswer:
		return "fast_answer"
	case FastMiss:
		return "fast_miss"
	case FastError:
		return "fast_error"
	case FastSkipped:
		return "fast_skipped"
	case Backfill:
		return "backfill"
	}
	return "unknown"
}

// Op is a cache operation, named in an Event.
type Op uint8

// The cache operations.
const (
	OpPeek     Op = iota + 1 // Cache.Peek, on each claim
	OpMark                   // Cache.Mark, after a backstop claim
	OpFill                   // Cache.Fill, a backstop replay copied into the cache
	OpComplete               // Cache.Complete, after the backstop completed
	OpRelease                // Cache.Release, after the backstop released
	OpRenew                  // Cache.Renew, after the backstop renewed
	OpPing                   // the cache's Ping (Store.Ping)
	OpEvict                  // the cache's Evict (Store.Evict)
)

var opNames = [...]string{OpPeek: "peek", OpMark: "mark", OpFill: "fill", OpComplete: "complete",
	OpRelease: "release", OpRenew: "renew", OpPing: "ping", OpEvict: "evict"}

// String returns the operation's stable name ("peek", "mark", "fill",
// "complete", "release", "renew", "ping", "evict"), for logs and metric labels.
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "unknown"
}

// Event is one fast-path event, passed to the WithObserver callback.
type Event struct {
	// Op is the cache operation. FastAnswer and FastMiss come only from OpPeek,
	// Backfill only from OpFill.
	Op Op
	// Kind classifies the event; Stats counts one per event.
	Kind EventKind
	// Err is the cache error for FastError, nil for the other kinds; a timeout wraps
	// ErrFastTimeout. store.ErrLeaseLost and the caller's own cancellation are not events.
	Err error
}

// Stats are the store's counters since New, one per Event of the matching kind. Each
// Claim with a fast store counts at most one of FastAnswers, FastMisses, FastErrors or
// FastSkipped for its peek.
type Stats struct {
	// FastAnswers counts claims the cache answered alone (replay, InFlight or Mismatch).
	FastAnswers int64
	// FastMisses counts peeks the cache could not decide; the backstop answered.
	FastMisses int64
	// FastErrors counts failed or timed-out cache calls of any Op; each (unless it is
	// store.ErrCorrupt or store.ErrInvalid) starts a cooldown.
	FastErrors int64
	// FastSkipped counts peeks, marks, fills and renewals skipped during a cooldown.
	FastSkipped int64
	// Backfills counts backstop replays copied into the cache.
	Backfills int64
	// Outages counts the times the fast path went down: a cache error (not
	// store.ErrCorrupt or store.ErrInvalid) while it was up. Each is logged once
	// (WithLogger), and its end once.
	Outages int64
	// Degraded is set from an outage's first cache error until the next cache call
	// that succeeds; meanwhile the store serves from the backstop alone and Ping
	// reports store.ErrDegraded.
	Degraded bool
}

type counters struct {
	answers, misses, errors, skipped, backfills atomic.Int64
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{
		FastAnswers: s.stats.answers.Load(),
		FastMisses:  s.stats.misses.Load(),
		FastErrors:  s.stats.errors.Load(),
		FastSkipped: s.stats.skipped.Load(),
		Backfills:   s.stats.backfills.Load(),
		Outages:     s.health.outages.Load(),
		Degraded:    s.health.down.Load(),
	}
}

func (s *Store) event(op Op, kind EventKind, err error) {
	switch kind {
	case FastAnswer:
		s.stats.answers.Add(1)
	case FastMiss:
		s.stats.misses.Add(1)
	case FastError:
		s.stats.errors.Add(1)
		// A corrupt or refused record is one key's problem, not the cache being down.
		if !errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrInvalid) {
			if s.cooldown > 0 {
				s.downUntil.Store(int64(time.Since(s.start) + s.cooldown))
			}
			s.outage(op, err)
		}
	case FastSkipped:
		s.stats.skipped.Add(1)
	case Backfill:
		s.stats.backfills.Add(1)
	}
	if s.observe != nil {
		s.observe(Event{Op: op, Kind: kind, Err: err})
	}
}

// fastUp reports whether the fast path may be used now, counting a skip otherwise.
func (s *Store) fastUp(op Op) bool {
	if until := s.downUntil.Load(); until != 0 && int64(time.Since(s.start)) < until {
		s.event(op, FastSkipped, nil)
		return false
	}
	return true
}

// fastCall runs f against the cache with the timeout, unless cooling down. It reports
// f's error (nil when skipped: callers treat "skipped" like "no answer"), and
// whether f ran.
//
// Completing and dropping a marker are attempted even while cooling down: skipping
// them would leave a marker answering InFlight for the rest of its lease although
// the backstop has moved on; so is an operator's eviction of the cached copy.
// (the cache being down makes them fail fast; only a hung cache costs them the
// timeout.)
func (s *Store) fastCall(ctx context.Context, op Op, f func(ctx context.Context) error) (ran bool, err error) {
	if op != OpComplete && op != OpRelease && op != OpEvict && !s.fastUp(op) {
		return false, nil
	}
	timedOut := false
	if s.inProcess {
		err = f(ctx) // never waits on I/O: no timer
	} else {
		fctx, cancel := context.WithTimeout(ctx, s.timeout)
		err = f(fctx)
		timedOut = fctx.Err() != nil || isTimeout(err)
		cancel()
	}
	if err != nil && !errors.Is(err, store.ErrLeaseLost) {
		if ctx.Err() == nil { // the caller's own cancellation is not the cache's fault
			if timedOut {
				err = fmt.Errorf("%w (%v): %w", ErrFastTimeout, s.timeout, err)
			}
			s.event(op, FastError, err)
		}
	} else {
		s.recovered()
	}
	return true, err
}

// Claim implements store.Store: the cache first, then the backstop (see the package
// doc). Errors are the backstop's (wrapped), or store.ErrInvalid.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	var (
		res    store.ClaimResult
		answer bool
	)
	ran, err := s.fastCall(ctx, OpPeek, func(ctx context.Context) (err error) {
		res, answer, err = s.fast.Peek(ctx, req.ID, req.Fingerprint)
		return err
	})
	if ran && err == nil {
		if answer {
			s.event(OpPeek, FastAnswer, nil)
			return res, nil
		}
		s.event(OpPeek, FastMiss, nil)
	}

	res, err = s.backstop.Claim(ctx, req)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("idemkey/store/tiered: backstop claim: %w", err)
	}
	switch res.Outcome {
	case store.Claimed:
		_, _ = s.fastCall(ctx, OpMark, func(ctx context.Context) error {
			return s.fast.Mark(ctx, req.ID, req.Fingerprint, res.Token, req.Lease)
		})
	case store.Completed:
		s.backfill(ctx, req.ID, res.Record)
	}
	return res, nil
}

// backfill copies a record the backstop replayed into the cache for the rest of its
// retention (measured on this process's clock against the record's ExpiresAt).
func (s *Store) backfill(ctx context.Context, id store.ID, rec *store.Record) {
	if rec == nil {
		return
	}
	ttl := time.Until(rec.ExpiresAt)
	if full := rec.ExpiresAt.Sub(rec.CompletedAt); ttl > full {
		ttl = full // a fast local clock must not extend the retention
	}
	if ttl < time.Millisecond {
		return
	}
	ran, err := s.fastCall(ctx, OpFill, func(ctx context.Context) error { return s.fast.Fill(ctx, id, rec, ttl) })
	if ran && err == nil {
		s.event(OpFill, Backfill, nil)
	}
}

// Complete implements store.Store: the backstop stores resp (token-fenced) and
// decides; then the cache's marker becomes the completed record for the remaining
// retention. The result is the backstop's: nil, store.ErrLeaseLost or its error.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	begun := time.Now()
	if err := s.backstop.Complete(ctx, id, token, resp, retention); err != nil {
		// On ErrLeaseLost the cache is left alone: a marker of token, if any, expires
		// with the lease the backstop already saw expire (or the holder released).
		return fmt.Errorf("idemkey/store/tiered: backstop complete: %w", err)
	}
	// The backstop's retention started after begun: caching for retention minus the
	// time spent keeps the cache's copy from outliving the backstop's record.
	if rest := retention - time.Since(begun); rest >= time.Millisecond {
		_, _ = s.fastCall(ctx, OpComplete, func(ctx context.Context) error {
			return s.fast.Complete(ctx, id, token, resp, rest)
		})
	}
	return nil
}

// NotifyCompleted implements store.CompletionNotifier. A handler completed id's
// record in its own transaction on the backstop (store/postgres CompleteTx) and
// committed; the cache's marker of token becomes the completed record for retention,
// best effort (the timeout, the cooldown and the counters of every cache call
// apply). The cache never decides: a copy that does not arrive only costs fast-path
// hits, and the marker answers InFlight until its lease ends at the latest.
func (s *Store) NotifyCompleted(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) {
	if retention < time.Millisecond {
		return
	}
	_, _ = s.fastCall(ctx, OpComplete, func(ctx context.Context) error {
		return s.fast.Complete(ctx, id, token, resp, retention)
	})
}

// Release implements store.Store: the backstop forgets id if token holds it and
// decides the result; then the cache's marker of token is dropped.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := s.backstop.Release(ctx, id, token); err != nil {
		return fmt.Errorf("idemkey/store/tiered: backstop release: %w", err)
	}
	// Without this the marker would answer InFlight until its lease ran out.
	_, _ = s.fastCall(ctx, OpRelease, func(ctx context.Context) error { return s.fast.Release(ctx, id, token) })
	return nil
}

// Renew implements store.Store: the backstop extends the lease and decides; the
// cache marker of token follows.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	if err := s.backstop.Renew(ctx, id, token, lease); err != nil {
		return fmt.Errorf("idemkey/store/tiered: backstop renew: %w", err)
	}
	_, _ = s.fastCall(ctx, OpRenew, func(ctx context.Context) error { return s.fast.Renew(ctx, id, token, lease) })
	return nil
}

// Wait implements store.Waiter with the backstop's notification (store/postgres:
// LISTEN/NOTIFY), the store that decides claims, and then, when the cache
// implements store.Waiter too (store/redis), the cache's: Complete reaches the cache
// after the backstop, so a waiter woken by the backstop alone could still meet the
// cache marker and answer InFlight. The cache's wait returns at once when the cache
// holds no live marker (completed, released, expired, or the cache skipped after an
// error), and ends with the marker's completion or release otherwise; a cache
// error only ends it early (the caller claims again). A backstop without
// store.Waiter gives an error wrapping errors.ErrUnsupported (the middleware then
// polls).
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	w, ok := s.backstop.(store.Waiter)
	if !ok {
		return fmt.Errorf("idemkey/store/tiered: backstop cannot wait: %w", errors.ErrUnsupported)
	}
	if err := w.Wait(ctx, id); err != nil {
		return fmt.Errorf("idemkey/store/tiered: backstop wait: %w", err)
	}
	if until := s.downUntil.Load(); until != 0 && int64(time.Since(s.start)) < until {
		return nil // the fast path is cooling down: claims skip the cache too
	}
	if fw, ok := s.fast.(store.Waiter); ok {
		if err := fw.Wait(ctx, id); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// isTimeout reports whether err is a timeout (a socket deadline or a context
// deadline, which go-redis reports either way).
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// HoldsTx reports whether the backstop holds claims in transactions
// (claim.TxStore, store/postgres TxStore): then the one-transaction mode works
// through s (ClaimTx).
func (s *Store) HoldsTx() bool {
	_, ok := s.backstop.(claim.TxStore)
	return ok
}

// ClaimTx implements claim.TxStore over a backstop that does (HoldsTx): the
// cache answers what it holds (a replay, a claim in flight), as in Claim, and
// the backstop claims in its transaction; a completed record it returns
// backfills the cache, which learns of a committed one through
// NotifyCompleted. Errors as Claim's; store.ErrInvalid when the backstop holds
// no claim in a transaction.
func (s *Store) ClaimTx(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, claim.Tx, error) {
	bs, ok := s.backstop.(claim.TxStore)
	if !ok {
		return store.ClaimResult{}, nil, fmt.Errorf("idemkey/store/tiered: %w: the backstop holds no claim in a transaction", store.ErrInvalid)
	}
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, nil, err
	}
	var res store.ClaimResult
	var answer bool
	ran, err := s.fastCall(ctx, OpPeek, func(ctx context.Context) (err error) {
		res, answer, err = s.fast.Peek(ctx, req.ID, req.Fingerprint)
		return err
	})
	if ran && err == nil && answer {
		s.event(OpPeek, FastAnswer, nil)
		return res, nil, nil
	}
	res, tx, err := bs.ClaimTx(ctx, req)
	if err != nil {
		return store.ClaimResult{}, nil, fmt.Errorf("idemkey/store/tiered: backstop claim: %w", err)
	}
	switch res.Outcome {
	case store.Claimed: // the marker NotifyCompleted completes after the commit
		_, _ = s.fastCall(ctx, OpMark, func(ctx context.Context) error {
			return s.fast.Mark(ctx, req.ID, req.Fingerprint, res.Token, req.Lease)
		})
		tx = markedTx{Tx: tx, s: s, id: req.ID, token: res.Token}
	case store.Completed:
		s.backfill(ctx, req.ID, res.Record)
	}
	return res, tx, nil
}

// markedTx is a backstop transaction whose claim is marked in the cache: its
// rollback releases the marker too, which would otherwise answer InFlight until
// its lease ran out.
type markedTx struct {
	claim.Tx
	s     *Store
	id    store.ID
	token store.Token
}

func (t markedTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	_, _ = t.s.fastCall(ctx, OpRelease, func(ctx context.Context) error { return t.s.fast.Release(ctx, t.id, t.token) })
	return err
}

// Unwrap returns the backstop's transaction (its accessor finds it so).
func (t markedTx) Unwrap() claim.Tx { return t.Tx }
