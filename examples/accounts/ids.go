package accounts

import (
	"strconv"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/writeloop"
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
// within scope, performing operation (docs/account-service.md section 1.2):
// writeloop.EventID(EventIDNamespace, scope, key, operation), a UUIDv5 over the three
// parts, each preceded by its length as an unsigned varint, so two scopes' keys never
// meet. operation names the route and its decided arguments (Operation builds it): a
// retry of the same operation finds its event, a different operation reusing the key
// after the middleware forgot it (a lost record, a retention shorter than the dedup
// window) gets its own EventId and executes instead of being answered with the first
// one's result. Any key is accepted, UUID-shaped or not (this replaces the reference's
// "non-UUID key gets a random id", docs/account-service.md section 6.2.1, option 7.5(c)).
// A request with no key gets NewEventID.
func EventIDFor(scope, key, operation string) uuid.UUID {
	return writeloop.EventID(EventIDNamespace, scope, key, operation)
}

// Operation is the operation part of EventIDFor for a write: its kind ("deposit",
// "withdraw" or "transfer"), the account ids in canonical form and the amount in cents,
// e.g. "deposit 6128e305-7e13-5ce6-ba25-6a4b44cc9f0e 100". For a transfer pass the from
// and to accounts.
func Operation(kind string, amountCents int32, accounts ...uuid.UUID) string {
	b := make([]byte, 0, len(kind)+12+37*len(accounts))
	b = append(b, kind...)
	for _, a := range accounts {
		b = append(b, ' ')
		b = append(b, a.String()...)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(amountCents), 10)
	return string(b)
}

// NewEventID returns a fresh random (version 4) EventId, for a write that carries no
// idempotency key. Every write needs an EventId: the 2002 ownership check compares them.
func NewEventID() uuid.UUID { return uuid.New() }
