package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/inbox"
	"github.com/idemkey/idemkey/store/postgres/outbox"
)

// maxAmount caps amountCents (1,000,000.00 in the currency).
const maxAmount = 100_000_000

var (
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
	customerRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// paymentRequest is the body of POST /payments; pointers tell a missing field
// from a zero.
type paymentRequest struct {
	AmountCents *int64  `json:"amountCents"`
	Currency    *string `json:"currency"`
	CustomerID  *string `json:"customerId"`
}

// api serves the payments routes.
type api struct {
	pool     *pgxpool.Pool
	records  *postgres.Store
	payments *payments
	gateway  *gatewayClient
	logger   *slog.Logger
	// outbox holds the receipt of every payment created, written in the
	// payment's transaction (receipt.go).
	outbox *outbox.Outbox
	// webhooks is the inbox of the provider's event ids (webhook.go).
	webhooks         *inbox.Inbox
	webhookSecret    []byte
	webhookTolerance time.Duration
}

// createPayment serves POST /payments behind the idempotency middleware:
//
//  1. validate the body (400 malformed_request, 422 validation_error; both are
//     stored by the middleware and replayed);
//  2. charge through the provider with a key derived from the idempotency key,
//     so a retry after a lost answer finds the same charge (a failure or timeout
//     answers 503 gateway_unavailable, which releases the key: the retry runs);
//  3. in one transaction, insert the payment row (unique on the provider's
//     charge id) and complete the idempotency record with the 201 it answers,
//     fenced by the claim's token (store/postgres CommitResponse): the row and
//     the record commit together or not at all, and with them the payment's
//     receipt in the outbox (receipt.go).
func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	cl, ok := claim.FromContext(r.Context())
	principal, _ := principalFrom(r.Context())
	if !ok {
		a.logger.Error("POST /payments ran without an idempotency claim: the route must be behind the middleware")
		writeProblem(w, http.StatusInternalServerError, "internal_error", "The server is misconfigured.", 0)
		return
	}
	pay, status, code, detail := decodePayment(r.Body)
	if status != 0 {
		writeProblem(w, status, code, detail, 0)
		return
	}
	// The charge and its record must happen even if the client hangs up: a retry
	// then replays them. Each step has its own deadline instead.
	ctx := context.WithoutCancel(r.Context())

	ch, err := a.gateway.charge(ctx, providerKey(cl.ID), pay.AmountCents, pay.Currency)
	var refused *gatewayRefused
	switch {
	case errors.As(err, &refused):
		a.logger.Warn("payment gateway refused a charge", "principal", principal, "err", err)
		writeProblem(w, http.StatusBadGateway, codeGatewayRefused, "The payment provider refused the charge.", 0)
		return
	case err != nil:
		a.logger.Info("payment gateway unavailable; the key is released for a retry", "principal", principal, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, codeGatewayUnavailable,
			"The payment provider did not confirm the charge; retry with the same Idempotency-Key (nothing is charged twice).", time.Second)
		return
	}
	pay.ProviderChargeID, pay.Status, pay.State = ch.ID, "succeeded", stateAuthorized

	if err := a.record(ctx, w, faultFrom(r.Context()), principal, cl.ID.Key, pay); err != nil {
		if errors.Is(err, store.ErrLeaseLost) {
			a.logger.Warn("idempotency lease lost before the commit; rolled back", "principal", principal)
			writeProblem(w, http.StatusConflict, codeLeaseLost,
				"Another request with this Idempotency-Key took over; retry to get its answer.", time.Second)
			return
		}
		a.logger.Error("recording a payment failed; rolled back", "principal", principal, "charge", ch.ID, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, codeDatabase,
			"The payment could not be recorded; retry with the same Idempotency-Key (nothing is charged twice).", time.Second)
	}
}

// record inserts the payment and completes the idempotency record with the 201
// in one transaction, then writes the 201 to w. On error nothing was written and
// the transaction is rolled back.
func (a *api) record(ctx context.Context, w http.ResponseWriter, f fault, principal, key string, pay Payment) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout+f.slow)
	defer cancel()
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // after Commit: does nothing
	pay, created, err := a.payments.insert(ctx, tx, principal, key, pay)
	if err != nil {
		return err
	}
	// The receipt commits with the payment, or neither does. A row the
	// natural-key safety net found (created false) had its receipt enqueued by
	// the transaction that inserted it, and maybe published and deleted since:
	// enqueuing it again would send it twice.
	if created {
		if err := a.enqueueReceipt(ctx, tx, principal, pay); err != nil {
			return err
		}
	}
	if f.slow > 0 {
		if err := sleepCtx(ctx, f.slow); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(pay) // strings and an int: cannot fail
	resp := store.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/" + pay.ID}},
		Body:   append(body, '\n'),
	}
	if f != (fault{}) { // X-Fault, only with PAYMENTS_FAULTS=1
		tx, w = faultTx{tx, f}, faultWriter{w, f}
	}
	return a.records.CommitResponse(ctx, tx, w, resp)
}

// providerKey is the idempotency key sent to the provider: the principal and
// the client's key, so two principals' equal keys stay two charges. Principals
// never contain ':' (PAYMENTS_TOKENS), so the pair is unambiguous.
func providerKey(id store.ID) string { return id.Scope + ":" + id.Key }

// decodePayment parses and validates a POST /payments body. status is 0 when
// it is valid; otherwise status, code and detail describe the problem.
func decodePayment(body io.Reader) (pay Payment, status int, code, detail string) {
	var req paymentRequest
	dec := json.NewDecoder(body)
	name, err := decodeRequest(dec, &req)
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr) && name != "":
		return pay, http.StatusUnprocessableEntity, codeValidation, name + " has the wrong type; want " + wantType(name) + "."
	case errors.Is(err, errUnknownField):
		return pay, http.StatusUnprocessableEntity, codeValidation, "Unknown field " + strconv.Quote(name) + "; the fields are amountCents, currency and customerId."
	case errors.Is(err, errRepeatedField):
		return pay, http.StatusUnprocessableEntity, codeValidation, name + " appears more than once."
	case err != nil:
		return pay, http.StatusBadRequest, codeMalformed, `The body must be one JSON object such as {"amountCents": 1250, "currency": "EUR", "customerId": "cust-1"}.`
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return pay, http.StatusBadRequest, codeMalformed, "The body must hold one JSON object and nothing after it."
	}
	switch {
	case req.AmountCents == nil || *req.AmountCents < 1 || *req.AmountCents > maxAmount:
		return pay, http.StatusUnprocessableEntity, codeValidation, "amountCents must be an integer from 1 to 100000000 (minor units of the currency)."
	case req.Currency == nil || !currencyRE.MatchString(*req.Currency):
		return pay, http.StatusUnprocessableEntity, codeValidation, "currency must be an ISO 4217 code of three upper-case letters, such as EUR."
	case req.CustomerID == nil || !customerRE.MatchString(*req.CustomerID):
		return pay, http.StatusUnprocessableEntity, codeValidation, "customerId must be 1-64 letters, digits and . _ -."
	}
	return Payment{AmountCents: *req.AmountCents, Currency: *req.Currency, CustomerID: *req.CustomerID}, 0, "", ""
}

// Errors of decodeRequest about the members, not the JSON syntax.
var (
	errNotObject     = errors.New("not a JSON object")
	errUnknownField  = errors.New("unknown field")
	errRepeatedField = errors.New("repeated field")
)

// decodeRequest reads one JSON object from dec into req, matching member names
// exactly and taking each at most once: encoding/json alone would accept
// "AMOUNTCENTS" and read {"amountCents":5,"amountcents":7} as 7, so a proxy or
// log that reads the first member would see another amount than the one charged.
// name is the member an error is about.
func decodeRequest(dec *json.Decoder, req *paymentRequest) (name string, err error) {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", errors.Join(errNotObject, err)
	}
	var seen [3]bool
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", err
		}
		name, _ = t.(string)
		var i int
		var dst any
		switch name {
		case "amountCents":
			i, dst = 0, &req.AmountCents
		case "currency":
			i, dst = 1, &req.Currency
		case "customerId":
			i, dst = 2, &req.CustomerID
		default:
			return name, errUnknownField
		}
		if seen[i] {
			return name, errRepeatedField
		}
		seen[i] = true
		if err := dec.Decode(dst); err != nil {
			return name, err
		}
	}
	_, err = dec.Token() // the closing brace
	return "", err
}

func wantType(field string) string {
	if field == "amountCents" {
		return "an integer"
	}
	return "a string"
}

// getPayment serves GET /payments/{id}: the principal's payment, or 404.
func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	principal, _ := principalFrom(r.Context())
	ctx, cancel := context.WithTimeout(r.Context(), dbTimeout)
	defer cancel()
	pay, err := a.payments.get(ctx, principal, r.PathValue("id"))
	switch {
	case errors.Is(err, errNoPayment):
		writeProblem(w, http.StatusNotFound, codeNotFound, "No payment with this id for this principal.", 0)
		return
	case err != nil:
		a.logger.Error("reading a payment failed", "err", err)
		writeProblem(w, http.StatusServiceUnavailable, codeDatabase, "The payment could not be read; retry.", time.Second)
		return
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(pay)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}
