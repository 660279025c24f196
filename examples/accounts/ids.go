package accounts

import (
	"encoding/binary"

	"github.com/google/uuid"
)

// Identifiers of the reference account service (docs/account-service.md section 2.1). Every one is
// UUIDv5(ReferenceNamespace, name), so the values match the Rust and C# ports byte for
// byte and a stream written by either port folds the same way here.
var (
	// ReferenceNamespace is the namespace of every constant id below:
	// a1b2c3d4-e5f6-7890-abcd-ef1234567890.
	ReferenceNamespace = uuid.MustParse("a1b2c3d4-e5f6-7890-abcd-ef1234567890")

	// OrgID is UUIDv5 of "DemoOrg": the org part of every account's aggregate key.
	OrgID = uuid.MustParse("08480048-7b7e-524e-b2c0-9280ee03551f")
	// AccountTypeID is UUIDv5 of "Account": the aggregate type of every account.
	AccountTypeID = uuid.MustParse("36da35eb-4d26-55e7-8dde-feec79f6c80a")
	// ServiceClientID is UUIDv5 of "ReferenceApiService": the one Celeriant client id
	// shared by every replica of the service (docs/account-service.md section 2.1). ClientSeq is
	// per (aggregate, client id), and the server's version guard serialises replicas.
	ServiceClientID = uuid.MustParse("f13f8be7-34bc-55b6-ba4a-a18709401401")

	// AliceID, BobID and CharlieID are the seeded accounts (UUIDv5 of their names).
	AliceID   = uuid.MustParse("6128e305-7e13-5ce6-ba25-6a4b44cc9f0e")
	BobID     = uuid.MustParse("3da2fa7e-cf4d-55a1-ae0e-bad709d0de52")
	CharlieID = uuid.MustParse("1e344e71-e1fd-5788-930d-b09cdeec5bed")

	// EventIDNamespace is the namespace of EventIDFor:
	// 4c57ce62-0a44-5495-90e5-e0a0e2a33a5b, which is UUIDv5(ReferenceNamespace,
	// "idemkey/EventId"). It is part of the stored data's meaning: changing it would
	// make every retry after a deploy write a second event. Never change it.
	EventIDNamespace = uuid.MustParse("4c57ce62-0a44-5495-90e5-e0a0e2a33a5b")
)

// Account is one entry of the fixed account list served by GET /api/accounts.
type Account struct {
	ID          uuid.UUID // the aggregate id of the account's stream (see Key)
	Name        string    // display name served as "name", e.g. "Alice"
	SeedBalance int64     // cents deposited by Seed on an empty stream
}

// SeededAccounts returns the three accounts the service seeds at startup
// (docs/account-service.md section 2.4): Alice 50 000, Bob 25 000 and Charlie 10 000 cents.
// The slice is fresh on every call.
func SeededAccounts() []Account {
	return []Account{
		{ID: AliceID, Name: "Alice", SeedBalance: 50_000},
		{ID: BobID, Name: "Bob", SeedBalance: 25_000},
		{ID: CharlieID, Name: "Charlie", SeedBalance: 10_000},
	}
}

// EventIDFor returns the Celeriant EventId of the request whose Idempotency-Key is key
// within scope (docs/account-service.md section 1.2): UUIDv5(EventIDNamespace, name), where name is the
// scope's length as an unsigned varint, then the scope bytes, then the key bytes. The
// length prefix keeps ("ab","c") and ("a","bc") apart, so two scopes' keys never meet.
// Any key is accepted, UUID-shaped or not, so every retry of a keyed request carries the
// same EventId (this replaces the reference's "non-UUID key gets a random id",
// docs/account-service.md section 6.2.1, option 7.5(c)). A request with no key gets NewEventID.
func EventIDFor(scope, key string) uuid.UUID {
	name := make([]byte, 0, binary.MaxVarintLen64+len(scope)+len(key))
	name = binary.AppendUvarint(name, uint64(len(scope)))
	name = append(name, scope...)
	name = append(name, key...)
	return uuid.NewSHA1(EventIDNamespace, name)
}

// NewEventID returns a fresh random (version 4) EventId, for a write that carries no
// idempotency key. Every write needs an EventId: the 2002 ownership check compares them.
func NewEventID() uuid.UUID { return uuid.New() }
