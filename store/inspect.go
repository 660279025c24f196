package store

import (
	"context"
	"time"
)

// Inspector is implemented by stores that let an operator look at, and remove, the
// record of one key: store/memory, store/postgres, store/redis and store/tiered do.
// It is optional: the middleware calls only Inspect, only to tell a fingerprint
// rule change from another payload on a mismatch (middleware.FingerprintRule.Body).
// Each call is one round trip (one statement, one script), like the
// transitions of Store.
//
// Inspect reports id's record as the next Claim would find it, and changes nothing:
// no lease, deadline or token moves, and a record past its retention is reported
// as StateAbsent (whether or not it was swept yet).
//
// Evict removes id's record if policy allows it for the state the store finds, in
// the same round trip that decides (the condition is checked atomically with the
// removal, so a record completed or claimed meanwhile is judged in its new state).
// found is the record as Evict found it (StateAbsent when there was none) and
// evicted reports whether it was removed. Refusing is not an error: evicted is
// false and found says why (an in-flight record with a live lease under a policy
// without EvictLive). After an eviction the key is new: the next Claim runs the
// handler again, for any fingerprint, and the evicted holder's token is refused
// (store.ErrLeaseLost) by Complete, Release and Renew.
//
// Errors: ErrInvalid (wrapped) for an invalid id (ID.Validate) or an empty
// policy, before any I/O; ErrCorrupt for a record that cannot be decoded (Evict then removes
// nothing); otherwise the store's own error (connection, timeout, cancellation),
// wrapped. docs/stores.md section 6 lists each backend's statement or script.
type Inspector interface {
	Inspect(ctx context.Context, id ID) (Info, error)
	Evict(ctx context.Context, id ID, policy EvictPolicy) (found Info, evicted bool, err error)
}

// State is the state of a key's record as Inspect and Evict report it.
type State uint8

// The three states a key can be in.
const (
	// StateAbsent: no record, or one past its retention. The next claim runs the
	// handler.
	StateAbsent State = iota
	// StateInFlight: claimed and neither completed nor released. Its lease may be
	// live (a holder is working; claims answer InFlight) or expired (the holder
	// presumably died; the next claim with the same fingerprint takes over).
	StateInFlight
	// StateCompleted: a stored response is replayed until ExpiresAt.
	StateCompleted
)

// String returns the state's name: "absent", "in_flight" or "completed".
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateInFlight:
		return "in_flight"
	case StateCompleted:
		return "completed"
	}
	return "unknown"
}

// Info describes one key's record. Times are on the store's clock (Postgres's
// now(), the Redis server's TIME, the memory store's clock), at the store's
// precision (milliseconds for Redis, microseconds for Postgres); compare them
// with Now, never with the caller's clock. Redis keeps CreatedAt and CompletedAt
// on the application's clock (store/redis); its LeaseUntil and ExpiresAt, the
// ones LeaseLive and LeaseRemaining judge, are the server's. For StateAbsent every field but State
// and Now is zero.
type Info struct {
	// State is absent, in flight or completed.
	State State
	// Fingerprint of the request that claimed the key.
	Fingerprint Fingerprint
	// CreatedAt is when the key was first claimed (a takeover keeps it).
	CreatedAt time.Time
	// CompletedAt is when the response was stored; zero while in flight.
	CompletedAt time.Time
	// ExpiresAt is the end of the retention: after it the key is new again. For an
	// in-flight record it is the claim's retention (stretched by renewals).
	ExpiresAt time.Time
	// LeaseUntil is the holder's lease deadline; zero unless in flight.
	LeaseUntil time.Time
	// Status is the stored HTTP status (100-999); 0 unless completed.
	Status int
	// BodyBytes is the length of the stored body in bytes; 0 unless completed.
	BodyBytes int
	// BodyOmitted is set when the body was over the storage cap and a replay
	// carries status and headers only.
	BodyOmitted bool
	// Now is the store's clock when it answered, the reference for the times
	// above (LeaseLive, LeaseRemaining).
	Now time.Time
}

// LeaseLive reports whether the record is in flight with a lease that has not
// expired at Now: a holder may still be running the handler.
func (i Info) LeaseLive() bool { return i.State == StateInFlight && i.Now.Before(i.LeaseUntil) }

// LeaseRemaining is the rest of a live lease at Now; 0 when the lease is not live.
func (i Info) LeaseRemaining() time.Duration {
	if !i.LeaseLive() {
		return 0
	}
	return i.LeaseUntil.Sub(i.Now)
}

// EvictPolicy says which records Evict may remove: a set of the Evict* bits. The
// zero policy allows nothing and is refused with ErrInvalid.
type EvictPolicy uint8

// The records a policy can allow; combine them with |.
const (
	// EvictCompleted allows removing a completed record: the next request with
	// the key runs the handler again instead of replaying.
	EvictCompleted EvictPolicy = 1 << iota
	// EvictLeaseExpired allows removing an in-flight record whose lease has
	// expired (its holder stopped renewing, presumably dead).
	EvictLeaseExpired
	// EvictLive allows removing an in-flight record whose lease is live: the
	// "force" of an operator. The holder may still be running the handler; its
	// Complete is then refused, and a retry may run the handler a second time.
	EvictLive

	// EvictSettled is the operator's default: a completed record or an abandoned
	// claim, never a live one.
	EvictSettled = EvictCompleted | EvictLeaseExpired
	// EvictAny removes whatever record the key has.
	EvictAny = EvictCompleted | EvictLeaseExpired | EvictLive
)

// Allows reports whether p lets Evict remove a record in the state of found
// (judged at found.Now). An absent record is never "removed".
func (p EvictPolicy) Allows(found Info) bool {
	switch {
	case found.State == StateCompleted:
		return p&EvictCompleted != 0
	case found.State != StateInFlight:
		return false
	case found.LeaseLive():
		return p&EvictLive != 0
	}
	return p&EvictLeaseExpired != 0
}

// Validate checks that p allows something and names only known bits (wraps
// ErrInvalid).
func (p EvictPolicy) Validate() error {
	switch {
	case p == 0:
		return errorf("empty evict policy")
	case p&^EvictAny != 0:
		return errorf("unknown evict policy bits %#x", uint8(p&^EvictAny))
	}
	return nil
}

// String lists the policy's bits: "completed|lease_expired|live" ("none" for 0).
func (p EvictPolicy) String() string {
	if p == 0 {
		return "none"
	}
	s := ""
	for _, b := range []struct {
		bit  EvictPolicy
		name string
	}{{EvictCompleted, "completed"}, {EvictLeaseExpired, "lease_expired"}, {EvictLive, "live"}} {
		if p&b.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += b.name
		}
	}
	if p&^EvictAny != 0 {
		s += "|unknown"
	}
	return s
}

// ValidateInspect checks the id of Inspect as every transition does (ID.Validate;
// wraps ErrInvalid). Backends call it first and return its error unchanged.
func ValidateInspect(id ID) error { return id.Validate() }

// ValidateEvict checks the arguments of Evict: the id as ValidateInspect does and
// the policy (EvictPolicy.Validate). Backends call it first and return its error
// unchanged (it wraps ErrInvalid).
func ValidateEvict(id ID, policy EvictPolicy) error {
	if err := ValidateInspect(id); err != nil {
		return err
	}
	return policy.Validate()
}
