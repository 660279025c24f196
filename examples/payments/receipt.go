package main

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store/postgres/outbox"
)

// The receipt of a payment (the e-mail to the customer, an event to other
// services) is a side effect outside the database: it cannot join the
// payment's transaction, and sent from the handler it would go out for a
// payment that then rolls back, or never for one whose process died after the
// commit. So the handler writes it to the outbox (store/postgres/outbox) in the
// payment's own transaction, and the relay (examples/payments/relay) publishes
// it to NATS JetStream after the commit: once per committed payment, nothing
// for one rolled back. The relay publishes at least once, with the message id
// as Nats-Msg-Id; the receipts consumer makes it once with its inbox, keyed on
// that id.

// ReceiptTopic is the outbox topic of receipts, the subject the relay publishes
// them on (after RELAY_NATS_SUBJECT_PREFIX).
const ReceiptTopic = "payments.receipts"

// Receipt is the body of a receipt message.
type Receipt struct {
	// PaymentID is the payment's id; "receipt:<PaymentID>" is the message id.
	PaymentID        string `json:"paymentId"`
	Principal        string `json:"principal"`
	CustomerID       string `json:"customerId"`
	AmountCents      int64  `json:"amountCents"`
	Currency         string `json:"currency"`
	ProviderChargeID string `json:"providerChargeId"`
}

// receiptID is the stable id of a payment's receipt, for every publish.
func receiptID(paymentID string) string { return "receipt:" + paymentID }

// enqueueReceipt writes pay's receipt to the outbox in tx.
func (a *api) enqueueReceipt(ctx context.Context, tx pgx.Tx, principal string, pay Payment) error {
	body, _ := json.Marshal(Receipt{PaymentID: pay.ID, Principal: principal, CustomerID: pay.CustomerID,
		AmountCents: pay.AmountCents, Currency: pay.Currency, ProviderChargeID: pay.ProviderChargeID}) // cannot fail
	_, err := a.outbox.Enqueue(ctx, tx, outbox.Message{ID: receiptID(pay.ID), Topic: ReceiptTopic, Payload: body})
	return err
}
