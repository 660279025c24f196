// Package sharded is a store that routes every call for a scope to one of several
// stores, by a function the application gives: tenants sharded across databases,
// each tenant's idempotency records in the database that holds its rows, so a
// handler's in-transaction completion (store/postgres CompleteTx) keeps writing
// the record next to the side effect (docs/scaling.md).
//
// The route sees only the scope, never the key, so every call for one ID (Claim,
// Complete, Release, Renew, Wait, Inspect, Evict, NotifyCompleted) reaches the
// same shard; a tenant's records never reach another shard. ByHash is the route
// of the simple case: a stable hash of the scope over a fixed list of stores.
//
// A route must be stable for as long as records live: a scope moved to another
// shard finds none of its records there (a retry of a completed request would run
// again, and a claim in flight would not fence the retry). Move a tenant only
// after its records' retention has run out, or not at all.
package sharded

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Store routes each call to the shard of its scope. Build it with New; it is safe
// for concurrent use when the shards and the route are.
type Store struct {
	route  func(scope string) store.Store
	shards []store.Store
	prev   func(scope string) store.Store // the previous placement (NewMigration)
}

var (
	_ store.Store              = (*Store)(nil)
	_ store.Waiter             = (*Store)(nil)
	_ store.Inspector          = (*Store)(nil)
	_ store.Pinger             = (*Store)(nil)
	_ store.CompletionNotifier = (*Store)(nil)
	_ store.InProcess          = (*Store)(nil)
)

// ErrNoShard is returned (wrapped) when the route gives no store for a scope
// (nil), or a store that is not one of New's shards (a typed nil pointer from a
// map of missing tenants, a store built on the fly): a misconfigured route. The middleware answers it with 503, as any store
// failure.
var ErrNoShard = errors.New("idemkey/store/sharded: no shard for the scope")

// New returns a store that sends every call for a scope to route(scope). shards
// lists every store the route can return (Ping checks them all, InProcess asks
// them all); the route may return only stores of that list (any other answer is
// ErrNoShard). Errors wrap store.ErrInvalid: a nil route, no shard, a nil shard
// (also a nil pointer of a store type).
func New(route func(scope string) store.Store, shards ...store.Store) (*Store, error) {
	if route == nil {
		return nil, fmt.Errorf("idemkey/store/sharded: %w: nil route", store.ErrInvalid)
	}
	if len(shards) == 0 {
		return nil, fmt.Errorf("idemkey/store/sharded: %w: no shard", store.ErrInvalid)
	}
	for i, s := range shards {
		if v := reflect.ValueOf(s); s == nil || v.Kind() == reflect.Pointer && v.IsNil() {
			return nil, fmt.Errorf("idemkey/store/sharded: %w: shard %d is nil", store.ErrInvalid, i)
		}
		if !reflect.TypeOf(s).Comparable() {
			// Shard tells a listed store by ==, which such a value would make
			// panic; every store of this module is a pointer.
			return nil, fmt.Errorf("idemkey/store/sharded: %w: shard %d is a %T, which is not comparable (use a pointer)", store.ErrInvalid, i, s)
		}
	}
	return &Store{route: route, shards: append([]store.Store(nil), shards...)}, nil
}

// Shard returns the store of scope (the route's answer), for what only the
// shard's own type offers: a handler completing its record in its own
// transaction takes the tenant's *postgres.Store from here, so the record lands
// in the database the transaction writes to. ErrNoShard (wrapped) when the route
// gives none, or a store New was not given.
func (s *Store) Shard(scope string) (store.Store, error) {
	sh, err := s.member(s.route(scope))
	if err != nil {
		return nil, fmt.Errorf("%w (%d bytes)", err, len(scope))
	}
	return sh, nil
}

// member returns sh when it is one of New's shards, else ErrNoShard.
func (s *Store) member(sh store.Store) (store.Store, error) {
	// A value of a type that is not comparable is none of the shards (New
	// refuses such shards), and == would panic on it.
	if sh != nil && reflect.TypeOf(sh).Comparable() {
		for _, x := range s.shards {
			if x == sh {
				return sh, nil
			}
		}
	}
	return nil, ErrNoShard
}

// Shards returns the stores New was given, in order.
func (s *Store) Shards() []store.Store { return append([]store.Store(nil), s.shards...) }

// Claim implements store.Store on the shard of req.Scope. Arguments are
// validated first (store.ErrInvalid, whatever the shard); other errors are the
// shard's, or ErrNoShard.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	sh, err := s.claimShard(ctx, req.ID)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return sh.Claim(ctx, req)
}

// Complete implements store.Store on the shard of id.Scope.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	return s.holderCall(id, func(sh store.Store) error { return sh.Complete(ctx, id, token, resp, retention) })
}

// Release implements store.Store on the shard of id.Scope.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	return s.holderCall(id, func(sh store.Store) error { return sh.Release(ctx, id, token) })
}

// Renew implements store.Store on the shard of id.Scope.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	return s.holderCall(id, func(sh store.Store) error { return sh.Renew(ctx, id, token, lease) })
}

// Wait implements store.Waiter through the shard of id.Scope; a shard that is not
// a store.Waiter answers an error wrapping errors.ErrUnsupported (the middleware
// then polls).
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	sh, err := s.claimShard(ctx, id)
	if err != nil {
		return err
	}
	w, ok := sh.(store.Waiter)
	if !ok {
		return fmt.Errorf("idemkey/store/sharded: wait: %T cannot wait: %w", sh, errors.ErrUnsupported)
	}
	return w.Wait(ctx, id)
}

// Inspect implements store.Inspector through the shard of id.Scope; a shard that
// is not a store.Inspector answers an error wrapping errors.ErrUnsupported.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	in, err := s.inspector(ctx, id)
	if err != nil {
		return store.Info{}, err
	}
	return in.Inspect(ctx, id)
}

// Evict implements store.Inspector through the shard of id.Scope, as Inspect.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	in, err := s.inspector(ctx, id)
	if err != nil {
		return store.Info{}, false, err
	}
	return in.Evict(ctx, id, policy)
}

func (s *Store) inspector(ctx context.Context, id store.ID) (store.Inspector, error) {
	sh, err := s.claimShard(ctx, id)
	if err != nil {
		return nil, err
	}
	in, ok := sh.(store.Inspector)
	if !ok {
		return nil, fmt.Errorf("idemkey/store/sharded: %T cannot inspect: %w", sh, errors.ErrUnsupported)
	}
	return in, nil
}

// NotifyCompleted implements store.CompletionNotifier: it tells the shard of
// id.Scope when that shard is a store.CompletionNotifier (a tiered shard), and
// does nothing otherwise.
func (s *Store) NotifyCompleted(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) {
	sh, prev, _ := s.placements(id.Scope)
	if prev != nil {
		return // the record may be on either shard; a notice only saves a read
	}
	if n, ok := sh.(store.CompletionNotifier); ok {
		n.NotifyCompleted(ctx, id, token, resp, retention)
	}
}

// InProcess implements store.InProcess: true only when every shard answers
// without I/O (memory shards, in tests).
func (s *Store) InProcess() bool {
	for _, sh := range s.shards {
		if ip, ok := sh.(store.InProcess); !ok || !ip.InProcess() {
			return false
		}
	}
	return true
}
