// Package httpapi serves the account service over HTTP: the routes and JSON of docs/architecture.md
// section 6 (the camelCase names of the reference's Rust port, docs/account-service.md section 1.1),
// with every error as RFC 9457 problem details carrying a stable `code` member.
//
// The handler knows nothing about idempotency middleware. It learns the request's
// idempotency scope and key through a KeyFunc (wired by the application to the
// middleware's context accessor) and turns them into the Celeriant EventId with
// accounts.EventIDFor; a request without a key is written under a fresh random EventId.
//
// Routes:
//
//	GET  /api/accounts                           200 {"accounts":[{"id","name"}]}
//	GET  /api/accounts/{id}/balance?minVersion=N 200 {"balanceCents","aggregateVersion"}
//	GET  /api/accounts/{id}/history?fromVersion=N
//	     200 {"events":[{"aggregateVersion","timestamp","type","amountCents",
//	          "toAccountId"?,"fromAccountId"?}],"currentAggregateVersion","balanceCents"}
//	POST /api/accounts/{id}/deposit  {"amountCents":n} 200 {"balanceCents","aggregateVersion"}
//	POST /api/accounts/{id}/withdraw {"amountCents":n} 200 {"balanceCents","aggregateVersion"}
//	POST /api/transfers {"fromAccountId","toAccountId","amountCents"}
//	     200 {"from":{"balanceCents","aggregateVersion"},"to":{...}}
//	GET  /api/watch/stream  Server-Sent Events, served by the WithWatchStream handler
//	     (package watchfeed); 404 without one
//
// Request bodies must be one JSON object; Content-Type is not checked. Field names are
// matched exactly: another letter case, an unknown name or a repeated one is a 422.
//
// Errors are application/problem+json (RFC 9457) with the members type, title, status,
// detail, code, and the two the reference's web page reads: error (the code in upper case)
// and message (the detail). code is lower snake_case, as in every problem the project
// answers, and the last segment of type (docs/architecture.md section 3); error keeps the
// reference's upper-case spelling (docs/account-service.md section 1.3). By error:
//
//	400 MALFORMED_REQUEST   body is not one JSON object, a path id is not a UUID, a bad query
//	404 NOT_FOUND           no such route; 405 METHOD_NOT_ALLOWED (with Allow)
//	413 PAYLOAD_TOO_LARGE   body over the limit (default 64 KiB)
//	422 VALIDATION_ERROR    unknown field (names are case-sensitive), repeated field, wrong
//	                        type, missing field, amount outside int32 or not positive, an
//	                        account id in the body that is not a UUID, the nil UUID as an
//	                        account id (path or body), a transfer to the same account
//	422 INSUFFICIENT_FUNDS  with balanceCents (the debited account's balance)
//	409 CONFLICT            the write loop gave up; retry with the same key (Retry-After: 1)
//	503 SERVICE_UNAVAILABLE the event store cannot be reached, or the request's context
//	                        ended mid-write (Retry-After: 1)
//	500 INTERNAL_ERROR      anything else; the detail is logged, not returned
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/examples/accounts"
)

// Service is what the handler needs from the account service; *accounts.Service
// implements it, and each method has the contract (units, errors) documented there.
type Service interface {
	Accounts() []accounts.Account
	Balance(ctx context.Context, acct uuid.UUID, minVersion uint64) (accounts.Result, error)
	History(ctx context.Context, acct uuid.UUID, fromVersion uint64) (accounts.History, error)
	Deposit(ctx context.Context, acct uuid.UUID, amountCents int32, eventID uuid.UUID) (accounts.Result, error)
	Withdraw(ctx context.Context, acct uuid.UUID, amountCents int32, eventID uuid.UUID) (accounts.Result, error)
	Transfer(ctx context.Context, from, to uuid.UUID, amountCents int32, eventID uuid.UUID) (accounts.TransferResult, error)
}

var _ Service = (*accounts.Service)(nil)

// KeyFunc returns the idempotency scope and key of a request, as the idempotency
// middleware parsed them (ok = false: the request carries no key). Wire it to the
// middleware's context accessor.
type KeyFunc func(r *http.Request) (scope, key string, ok bool)

// DefaultMaxBodyBytes is the default limit on a request body.
const DefaultMaxBodyBytes = 64 << 10

// ProblemTypePrefix starts the RFC 9457 type URI of the account API's own problems
// (its business and routing errors); the code in lower case follows, e.g.
// "urn:example:accounts:problem:insufficient_funds". The namespace is the API's,
// not the library's: the idempotency middleware's problems keep their
// "urn:idemkey:problem:" types. "urn:example:" is the namespace RFC 6963 reserves
// for examples; a real service uses a URI of its own, ideally one that serves the
// problem's documentation.
const ProblemTypePrefix = "urn:example:accounts:problem:"

// Handler serves the account API. Safe for concurrent use.
type Handler struct {
	svc     Service
	keyFunc KeyFunc
	landed  LandedFunc
	maxBody int64
	log     *slog.Logger
	mux     *http.ServeMux
	stream  http.Handler
	// fallback answers the requests no route takes (404, 405, a redirect to
	// the cleaned path), wrapped by WithUnrouted.
	fallback http.Handler
}

// Option configures a Handler.
type Option func(*Handler)

// WithKeyFunc sets how the handler finds a request's idempotency scope and key (default:
// never, so every write gets a random EventId).
func WithKeyFunc(f KeyFunc) Option { return func(h *Handler) { h.keyFunc = f } }

// LandedFunc reports whether an earlier run of the request may have written without
// answering: the idempotency middleware's claim was a takeover of an expired lease.
// Wire it to the middleware's claim accessor.
type LandedFunc func(r *http.Request) bool

// WithLandedFunc sets how the handler learns that a request may already have landed
// (default: never). Such a write first searches the stream for its EventId
// (accounts.MayHaveLanded), so a late retry after a takeover does not write twice.
func WithLandedFunc(f LandedFunc) Option { return func(h *Handler) { h.landed = f } }

// context returns the service context of r: r's, marked with accounts.MayHaveLanded
// when the LandedFunc says so.
func (h *Handler) context(r *http.Request) context.Context {
	if h.landed != nil && h.landed(r) {
		return accounts.MayHaveLanded(r.Context())
	}
	return r.Context()
}

// WithMaxBodyBytes sets the request body limit (default 64 KiB); n <= 0 is ignored.
func WithMaxBodyBytes(n int64) Option {
	return func(h *Handler) {
		if n > 0 {
			h.maxBody = n
		}
	}
}

// WithWatchStream serves GET /api/watch/stream with h (the live-update stream of
// package watchfeed, docs/account-service.md section 1.1).
func WithWatchStream(h http.Handler) Option { return func(hd *Handler) { hd.stream = h } }

// WithUnrouted wraps the handler's answers to requests that no route takes (404
// NOT_FOUND, 405 METHOD_NOT_ALLOWED, a redirect to the cleaned path) with wrap.
// Behind the idempotency middleware pass middleware.Unrouted, so that such an
// answer releases the request's key instead of spending it: the client's
// corrected request with the same key then runs.
func WithUnrouted(wrap func(http.Handler) http.Handler) Option {
	return func(h *Handler) { h.fallback = wrap(h.fallback) }
}

// WithLogger sets the logger for internal errors (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(h *Handler) {
		if l != nil {
			h.log = l
		}
	}
}

// New returns the API handler over svc.
func New(svc Service, opts ...Option) *Handler {
	h := &Handler{svc: svc, maxBody: DefaultMaxBodyBytes, log: slog.Default(), mux: http.NewServeMux()}
	h.fallback = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mux.ServeHTTP(&problemFallback{ResponseWriter: w}, r)
	})
	for _, o := range opts {
		o(h)
	}
	h.mux.HandleFunc("GET /api/accounts", h.listAccounts)
	h.mux.HandleFunc("GET /api/accounts/{id}/balance", h.balance)
	h.mux.HandleFunc("GET /api/accounts/{id}/history", h.history)
	h.mux.HandleFunc("POST /api/accounts/{id}/deposit", h.deposit)
	h.mux.HandleFunc("POST /api/accounts/{id}/withdraw", h.withdraw)
	h.mux.HandleFunc("POST /api/transfers", h.transfer)
	if h.stream != nil {
		h.mux.Handle("GET /api/watch/stream", h.stream)
	}
	return h
}

// ServeHTTP implements http.Handler. Unknown routes and methods get problem details too.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := h.mux.Handler(r); pattern == "" {
		h.fallback.ServeHTTP(w, r)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// problemFallback rewrites the mux's own plain-text 404 and 405 answers as problems;
// anything else the mux answers (a redirect to a cleaned path) passes through.
type problemFallback struct {
	http.ResponseWriter
	wrote, pass bool
}

func (f *problemFallback) WriteHeader(status int) {
	if f.wrote {
		return
	}
	f.wrote = true
	switch status {
	case http.StatusNotFound:
		WriteProblem(f.ResponseWriter, status, "NOT_FOUND", "No such route.")
	case http.StatusMethodNotAllowed:
		WriteProblem(f.ResponseWriter, status, "METHOD_NOT_ALLOWED", "Method not allowed on this route.")
	default:
		f.pass = true
		f.ResponseWriter.WriteHeader(status)
	}
}

func (f *problemFallback) Write(b []byte) (int, error) {
	if !f.wrote {
		f.WriteHeader(http.StatusOK)
	}
	if f.pass {
		return f.ResponseWriter.Write(b)
	}
	return len(b), nil // the mux's plain-text error body is dropped
}

// eventID returns the request's EventId: UUIDv5 over (scope, key, operation) when the
// request has an idempotency key, a fresh random one otherwise.
func (h *Handler) eventID(r *http.Request, operation string) uuid.UUID {
	if h.keyFunc != nil {
		if scope, key, ok := h.keyFunc(r); ok {
			return accounts.EventIDFor(scope, key, operation)
		}
	}
	return accounts.NewEventID()
}

type accountJSON struct {
	ID   uuid.UUID `json:"id"`
	Name string    `json:"name"`
}

func (h *Handler) listAccounts(w http.ResponseWriter, r *http.Request) {
	list := h.svc.Accounts()
	out := struct {
		Accounts []accountJSON `json:"accounts"`
	}{Accounts: make([]accountJSON, len(list))}
	for i, a := range list {
		out.Accounts[i] = accountJSON{ID: a.ID, Name: a.Name}
	}
	writeJSON(w, out)
}

type resultJSON struct {
	BalanceCents     int64  `json:"balanceCents"`
	AggregateVersion uint64 `json:"aggregateVersion"`
}

func toJSON(r accounts.Result) resultJSON {
	return resultJSON{BalanceCents: r.BalanceCents, AggregateVersion: r.AggregateVersion}
}

func (h *Handler) balance(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	minVersion, ok := queryVersion(w, r, "minVersion")
	if !ok {
		return
	}
	res, err := h.svc.Balance(r.Context(), id, minVersion)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, toJSON(res))
}

type historyEventJSON struct {
	AggregateVersion uint64     `json:"aggregateVersion"`
	Timestamp        uint64     `json:"timestamp"`
	Type             string     `json:"type"`
	AmountCents      int32      `json:"amountCents"`
	ToAccountID      *uuid.UUID `json:"toAccountId,omitempty"`
	FromAccountID    *uuid.UUID `json:"fromAccountId,omitempty"`
}

func (h *Handler) history(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	from, ok := queryVersion(w, r, "fromVersion")
	if !ok {
		return
	}
	hist, err := h.svc.History(r.Context(), id, from)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Events                  []historyEventJSON `json:"events"`
		CurrentAggregateVersion uint64             `json:"currentAggregateVersion"`
		BalanceCents            int64              `json:"balanceCents"`
	}{Events: make([]historyEventJSON, len(hist.Events)), CurrentAggregateVersion: hist.CurrentAggregateVersion, BalanceCents: hist.BalanceCents}
	for i, e := range hist.Events {
		out.Events[i] = historyEventJSON{
			AggregateVersion: e.AggregateVersion, Timestamp: e.Timestamp, Type: e.Type.String(),
			AmountCents: e.AmountCents, ToAccountID: e.ToAccountID, FromAccountID: e.FromAccountID,
		}
	}
	writeJSON(w, out)
}

// amountBody is the body of deposit and withdraw.
type amountBody struct {
	AmountCents *int64 `json:"amountCents"`
}

func (h *Handler) deposit(w http.ResponseWriter, r *http.Request) {
	h.oneAccount(w, r, "deposit", h.svc.Deposit)
}

func (h *Handler) withdraw(w http.ResponseWriter, r *http.Request) {
	h.oneAccount(w, r, "withdraw", h.svc.Withdraw)
}

func (h *Handler) oneAccount(w http.ResponseWriter, r *http.Request,
	kind string, op func(context.Context, uuid.UUID, int32, uuid.UUID) (accounts.Result, error)) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var body amountBody
	if !h.decode(w, r, Field{"amountCents", &body.AmountCents}) {
		return
	}
	amount, ok := amountOf(w, body.AmountCents)
	if !ok {
		return
	}
	res, err := op(h.context(r), id, amount, h.eventID(r, accounts.Operation(kind, amount, id)))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, toJSON(res))
}

// transferBody is the body of POST /api/transfers. Account ids are strings so a bad one
// is a 422 naming the field rather than a generic type error.
type transferBody struct {
	FromAccountID *string `json:"fromAccountId"`
	ToAccountID   *string `json:"toAccountId"`
	AmountCents   *int64  `json:"amountCents"`
}

func (h *Handler) transfer(w http.ResponseWriter, r *http.Request) {
	var body transferBody
	if !h.decode(w, r, Field{"fromAccountId", &body.FromAccountID}, Field{"toAccountId", &body.ToAccountID}, Field{"amountCents", &body.AmountCents}) {
		return
	}
	from, ok := bodyID(w, "fromAccountId", body.FromAccountID)
	if !ok {
		return
	}
	to, ok := bodyID(w, "toAccountId", body.ToAccountID)
	if !ok {
		return
	}
	amount, ok := amountOf(w, body.AmountCents)
	if !ok {
		return
	}
	res, err := h.svc.Transfer(h.context(r), from, to, amount, h.eventID(r, accounts.Operation("transfer", amount, from, to)))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, struct {
		From resultJSON `json:"from"`
		To   resultJSON `json:"to"`
	}{toJSON(res.From), toJSON(res.To)})
}

// decode reads exactly one JSON object whose members are among fields, each at most
// once, with names compared exactly: encoding/json alone would match names in any
// letter case and take {"amountCents":100,"AMOUNTCENTS":3} as 3. It answers the
// problem itself and returns false on failure.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, fields ...Field) bool {
	name, err := DecodeObject(json.NewDecoder(http.MaxBytesReader(w, r.Body, h.maxBody)), fields)
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		WriteProblem(w, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "Request body is larger than "+strconv.FormatInt(tooBig.Limit, 10)+" bytes.")
	case errors.Is(err, ErrUnknownField):
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Unknown field "+strconv.Quote(name)+".")
	case errors.Is(err, ErrRepeatedField):
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field "+name+" appears more than once.")
	case errors.As(err, &typeErr):
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field "+name+" must be "+expected(name)+".")
	default:
		WriteProblem(w, http.StatusBadRequest, "MALFORMED_REQUEST", "Request body must be one JSON object.")
	}
	return false
}

// expected names the type a body field must have.
func expected(field string) string {
	if field == "amountCents" {
		return "an integer number of cents"
	}
	return "a UUID string"
}

// amountOf checks that amountCents is present and fits int32. Positivity is a business
// rule the service checks (after its index lookup, docs/account-service.md section 3.2).
func amountOf(w http.ResponseWriter, v *int64) (int32, bool) {
	switch {
	case v == nil:
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field amountCents is required.")
		return 0, false
	case *v < 1 || *v > MaxAmountCents:
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field amountCents must be a positive integer of at most 2147483647 cents.")
		return 0, false
	}
	return int32(*v), true
}

func bodyID(w http.ResponseWriter, field string, v *string) (uuid.UUID, bool) {
	if v == nil {
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field "+field+" is required.")
		return uuid.Nil, false
	}
	id, err := uuid.Parse(*v)
	if err != nil {
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field "+field+" must be a UUID.")
		return uuid.Nil, false
	}
	if id == uuid.Nil {
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Field "+field+" must not be the nil UUID.")
		return uuid.Nil, false
	}
	return id, true
}

func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		WriteProblem(w, http.StatusBadRequest, "MALFORMED_REQUEST", "Account id in the path must be a UUID.")
		return uuid.Nil, false
	}
	if id == uuid.Nil {
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", "Account id must not be the nil UUID.")
		return uuid.Nil, false
	}
	return id, true
}

// queryVersion parses an optional non-negative version query parameter (0 when absent).
func queryVersion(w http.ResponseWriter, r *http.Request, name string) (uint64, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		WriteProblem(w, http.StatusBadRequest, "MALFORMED_REQUEST", "Query parameter "+name+" must be a non-negative integer.")
		return 0, false
	}
	return v, true
}

// fail maps a service error to its problem (docs/account-service.md section 1.3, docs/architecture.md
// section 6).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var funds *accounts.InsufficientFundsError
	var valid *accounts.ValidationError
	switch {
	case errors.As(err, &funds):
		p := newProblem(http.StatusUnprocessableEntity, "INSUFFICIENT_FUNDS",
			"Cannot process "+dollars(funds.RequestedCents)+", balance is "+dollars(funds.BalanceCents))
		p.BalanceCents = &funds.BalanceCents
		writeProblem(w, p)
	case errors.As(err, &valid):
		WriteProblem(w, http.StatusUnprocessableEntity, "VALIDATION_ERROR", valid.Message)
	case errors.Is(err, accounts.ErrConflict):
		h.log.InfoContext(r.Context(), "accounts: write gave up", "path", r.URL.Path, "err", err)
		// The loop gave up on concurrent updates or ambiguous outcomes: a retry with the
		// same key a moment later usually succeeds.
		w.Header().Set("Retry-After", "1")
		WriteProblem(w, http.StatusConflict, "CONFLICT", "Account was modified concurrently. Please retry.")
	case errors.Is(err, accounts.ErrUnavailable):
		h.log.WarnContext(r.Context(), "accounts: event store or projection unavailable", "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "1")
		WriteProblem(w, http.StatusServiceUnavailable, "SERVICE_UNAVAILABLE", "The event store or the projection database is unreachable; retry later.")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The request's context ended (client gone or server timeout) mid-loop. The
		// outcome may be unknown; a retry with the same key resolves it.
		h.log.InfoContext(r.Context(), "accounts: request context ended", "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "1")
		WriteProblem(w, http.StatusServiceUnavailable, "SERVICE_UNAVAILABLE", "Request did not complete in time. Please retry.")
	default:
		h.log.ErrorContext(r.Context(), "accounts: internal error", "path", r.URL.Path, "err", err)
		WriteProblem(w, http.StatusInternalServerError, "INTERNAL_ERROR", "Internal error.")
	}
}

func dollars(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	cents := strconv.FormatInt(c%100, 10)
	if len(cents) == 1 {
		cents = "0" + cents
	}
	return sign + "$" + strconv.FormatInt(c/100, 10) + "." + cents
}
