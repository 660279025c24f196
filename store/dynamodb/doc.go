// Package dynamodb is the authoritative idempotency store on Amazon DynamoDB
// (github.com/aws/aws-sdk-go-v2/service/dynamodb): every transition of the
// store contract (package store, docs/architecture.md section 4) is one
// conditional write on the key's item, fenced by the holder's token.
//
// # Use
//
//	cfg, err := config.LoadDefaultConfig(ctx)            // github.com/aws/aws-sdk-go-v2/config
//	st, err := dynamodb.New(awsdynamodb.NewFromConfig(cfg), dynamodb.WithTable("idemkey_records"))
//	ttl, err := st.Migrate(ctx) // once at start-up, or create the table as docs/stores.md shows
//
// # Table
//
// One item per key, hash key only (docs/stores.md gives the CreateTable
// parameters and the IAM policy):
//
//	pk   B     scope length (uvarint), scope, key: any bytes, unambiguous
//	fp   B     fingerprint (32 bytes)
//	tok  B     fencing token of the current holder (16 bytes)
//	ls   N     lease deadline, Unix ms; removed by Complete
//	ex   N     end of the retention, Unix ms: the read side treats the item as absent after it
//	ttl  N     ex in Unix seconds, rounded up: the table's TTL attribute (deletion only)
//	ca   N     first claim, Unix ms (a takeover keeps it)
//	cd   N     completion, Unix ms
//	st   N     HTTP status; absent while in flight
//	hd   B     headers (store/codec); absent when none
//	bd   B     body; absent when empty or omitted
//	om   BOOL  the body was omitted
//
// # Whose clock
//
// DynamoDB has no clock in its expressions. Every deadline (lease, retention)
// is computed on the caller's clock and passed as a value (":now") into the
// condition that decides, so the clocks of all the application's replicas
// decide together: a replica whose clock runs d ahead sees every lease end d
// early, and can take over a claim whose holder is still working if d
// approaches the lease (the handler then runs twice). Keep the replicas on NTP
// (skew of milliseconds) and leases of seconds; WithClock exists for tests.
//
// # Claim, and why it is atomic
//
// A claim is one PutItem conditioned on "attribute_not_exists(pk) OR ex <=
// :now" (absent, or past its retention). DynamoDB serialises the conditional
// writes of one item, so of concurrent claims exactly one writes. A refused
// PutItem answers from the item that refused it: DynamoDB returns that item
// with the refusal (ReturnValuesOnConditionCheckFailure ALL_OLD), so a replay
// is one request; a server that does not (dynalite) costs one strongly
// consistent GetItem more. A record in flight with the same fingerprint whose
// lease has ended is taken over by one UpdateItem conditioned on the token read
// ("tok = :old AND attribute_not_exists(st) AND ls <= :now AND ex > :now"),
// so of concurrent takeovers one wins. When the item changed between the
// refusal and its read, Claim writes again (at most 8 times).
//
// Complete (UpdateItem), Release (DeleteItem) and Renew (UpdateItem) are
// conditioned on "tok = :tok AND attribute_not_exists(st) AND ex > :now": a
// failed condition is store.ErrLeaseLost. A Renew whose lease would outlive
// the retention stretches the retention with a second conditional UpdateItem.
//
// # Expiry
//
// TTL deletion is lazy (DynamoDB deletes expired items within days), so the
// store never relies on it: every read and every condition compares ex with
// the caller's clock, and an expired item is absent to every call. TTL only
// keeps the table from growing; Migrate turns it on where the server can, and
// a server without TTL (dynalite) works the same, with expired items left in
// place until a claim of the same key overwrites them.
//
// # Large responses
//
// An item holds at most 400 KB (MaxItemBytes). A response whose item would be
// larger is kept with its body omitted (store.Response.BodyOmitted, MaxBody
// gives the limit for a key and headers): the record completes, and a replay
// carries the status and headers and says the body was omitted, as for a body
// over the middleware's storage cap.
//
// # What it does not do
//
// Completion inside the handler's own DynamoDB transaction (TransactWriteItems
// with the record's fenced update and the handler's writes) is not offered:
// the DynamoDB-compatible server the tests run against (dynalite) does not
// serve TransactWriteItems, and the project ships no path it cannot test.
// Wait polls (DynamoDB has no notifications); Evict is a read and a
// conditional delete (two requests).
package dynamodb
