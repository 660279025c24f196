package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

// The provider's webhooks (POST /webhooks) move a payment through its states,
// each transition once, whatever the provider repeats or reorders:
//
//	authorized --charge.succeeded--> captured --charge.refunded--> refunded
//
//  1. the signature (fakegateway.SignatureHeader: HMAC-SHA256 with
//     PAYMENTS_WEBHOOK_SECRET over "<t>.<body>") is checked in constant time,
//     and t must be within PAYMENTS_WEBHOOK_TOLERANCE of the server's clock: a
//     forged body, or a captured one replayed after the tolerance, is refused
//     (400); one replayed within it is a duplicate for step 2;
//  2. the provider's event id goes through the inbox (store/postgres/inbox) in
//     the transaction of the transition: a duplicate, even one arriving while
//     the first copy's transaction is open, is answered 200 and changes nothing;
//  3. each transition is an UPDATE guarded by the state it leaves
//     (... WHERE state = 'authorized'): zero rows means it already happened, or
//     the event came before the one it follows.
//
// An event that came too early (a refund before its capture, any event before
// the payment's row committed) rolls back, inbox row included, and is answered
// 409 event_too_early: the provider delivers it again later, when it applies.
// Nothing is recorded half-way and no event is lost, as long as the provider
// retries non-2xx answers (every payment provider does, for days).

// Webhook problem codes.
const (
	codeBadSignature   = "invalid_signature" // 400: missing, malformed, stale or wrong signature
	codeBadEvent       = "invalid_event"     // 400: not an event of the provider
	codeEventTooEarly  = "event_too_early"   // 409: its predecessor has not happened yet; redeliver later
	codeWebhooksOff    = "webhooks_disabled" // 404: PAYMENTS_WEBHOOK_SECRET is not set
	webhookConsumer    = "gateway-webhooks"  // the inbox's consumer name
	maxWebhookBody     = 64 << 10            // bytes
	defaultWebhookSkew = 5 * time.Minute     // PAYMENTS_WEBHOOK_TOLERANCE
	stateAuthorized    = "authorized"
	stateCaptured      = "captured"
	stateRefunded      = "refunded"
)

// Signature errors; the client sees one problem, the log the reason.
var (
	errNoSignature    = errors.New("no " + fakegateway.SignatureHeader + " header")
	errBadSignature   = errors.New("malformed " + fakegateway.SignatureHeader + " header")
	errStaleSignature = errors.New("signature timestamp outside the tolerance")
	errWrongSignature = errors.New("no signature matches")
)

// verifySignature checks header, "t=<unix seconds>,v1=<hex>" (several v1 are
// allowed, for a secret being rotated), against body: t within tolerance of
// now, and one v1 equal, in constant time, to HMAC-SHA256(secret, "<t>.<body>").
func verifySignature(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return errNoSignature
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
			return errBadSignature
		case k == "t":
			ts = v
		case k == "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return errBadSignature
			}
			sigs = append(sigs, sig)
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return errBadSignature
	}
	if d := now.Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
		return errStaleSignature
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return errWrongSignature
}

// errTooEarly: the event's transition cannot apply yet.
var errTooEarly = errors.New("event too early")

// receiveWebhook serves POST /webhooks (outside the idempotency middleware:
// the provider's event id is the key, through the inbox).
func (a *api) receiveWebhook(w http.ResponseWriter, r *http.Request) {
	if len(a.webhookSecret) == 0 {
		writeProblem(w, http.StatusNotFound, codeWebhooksOff, "Webhooks are not configured (PAYMENTS_WEBHOOK_SECRET).", 0)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, codeBadEvent, "The body could not be read, or is over 64 KiB.", 0)
		return
	}
	if err := verifySignature(a.webhookSecret, r.Header.Get(fakegateway.SignatureHeader), body, time.Now(), a.webhookTolerance); err != nil {
		a.logger.Warn("webhook refused", "err", err, "remote", r.RemoteAddr)
		writeProblem(w, http.StatusBadRequest, codeBadSignature, "The webhook signature is missing, malformed, stale or wrong.", 0)
		return
	}
	var ev fakegateway.Event
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" || ev.Data.ID == "" {
		writeProblem(w, http.StatusBadRequest, codeBadEvent, "The body is not an event with an id and a charge.", 0)
		return
	}
	if ev.Type != fakegateway.EventChargeSucceeded && ev.Type != fakegateway.EventChargeRefunded {
		writeJSON(w, map[string]string{"eventId": ev.ID, "outcome": "ignored"}) // a type we do not follow: acknowledge it
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), dbTimeout)
	defer cancel()
	outcome, err := a.webhooks.Process(ctx, webhookConsumer, ev.ID, func(ctx context.Context, tx pgx.Tx) error {
		return a.payments.transition(ctx, tx, ev)
	})
	switch {
	case errors.Is(err, errTooEarly):
		a.logger.Info("webhook too early; the provider will redeliver it", "event", ev.ID, "type", ev.Type, "charge", ev.Data.ID, "err", err)
		writeProblem(w, http.StatusConflict, codeEventTooEarly, err.Error()+"; deliver it again later.", time.Second)
	case err != nil:
		a.logger.Error("webhook not applied; rolled back", "event", ev.ID, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, codeDatabase, "The event could not be applied; deliver it again.", time.Second)
	default:
		writeJSON(w, map[string]string{"eventId": ev.ID, "outcome": outcome.String()})
	}
}

// transition applies ev to its payment in tx: the UPDATE only matches the
// state the transition leaves, so a transition happens once. Zero rows: the
// payment is already at or past the target (nil: nothing to do), or before the
// source state, or not recorded yet (errTooEarly: roll back, redeliver later).
// The state is then read FOR UPDATE, which waits for a transition in flight:
// the UPDATE's snapshot may have predated one that just committed (a capture
// committing while its refund's UPDATE ran), and the UPDATE runs once more.
func (p *payments) transition(ctx context.Context, tx pgx.Tx, ev fakegateway.Event) error {
	from, to := stateAuthorized, stateCaptured
	if ev.Type == fakegateway.EventChargeRefunded {
		from, to = stateCaptured, stateRefunded
	}
	for attempt := 0; ; attempt++ {
		var id string
		err := tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET state = $3 WHERE provider_charge_id = $1 AND state = $2 RETURNING id::text`, p.table),
			ev.Data.ID, from, to).Scan(&id)
		if err == nil {
			_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (payment_id, event_id, from_state, to_state) VALUES ($1, $2, $3, $4)`, p.transitions),
				id, ev.ID, from, to)
			return err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var state string
		err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT state FROM %s WHERE provider_charge_id = $1 FOR UPDATE`, p.table), ev.Data.ID).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: no payment for charge %s yet", errTooEarly, ev.Data.ID)
		case err != nil:
			return err
		case state == from && attempt == 0:
			continue // became eligible meanwhile; now locked
		case stateRank(state) <= stateRank(from):
			return fmt.Errorf("%w: %s for a payment still %s", errTooEarly, ev.Type, state)
		}
		return nil // already happened
	}
}

func stateRank(s string) int {
	return map[string]int{stateAuthorized: 1, stateCaptured: 2, stateRefunded: 3}[s]
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}
