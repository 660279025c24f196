package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/examples/payments/internal/fakegateway"
)

// errGatewayUnavailable: the provider answered 5xx, or nothing in time (a lost
// answer or a timeout). The charge may or may not have happened; a retry with
// the same provider key is safe, because the provider deduplicates on it.
var errGatewayUnavailable = errors.New("payment gateway unavailable")

// gatewayRefused is a 4xx answer of the provider: retrying will not help.
type gatewayRefused struct {
	status int
	body   string
}

func (e *gatewayRefused) Error() string {
	return fmt.Sprintf("payment gateway refused the charge: %d %s", e.status, e.body)
}

// gatewayClient charges through the provider's POST /charges.
type gatewayClient struct {
	url    string // the POST /charges URL
	client *http.Client
}

// newGatewayClient returns a client of the gateway at base (GATEWAY_URL). Every
// call is bounded by timeout, which must leave the handler time to commit
// within its lease.
func newGatewayClient(base string, timeout time.Duration) (*gatewayClient, error) {
	u, err := fakegateway.ChargesURL(base)
	if err != nil {
		return nil, fmt.Errorf("%w: GATEWAY_URL: %w", errConfig, err)
	}
	return &gatewayClient{url: u, client: &http.Client{Timeout: timeout}}, nil
}

// charge asks the provider to charge amountCents in currency under key, the
// provider's idempotency key: the same key always yields the same charge.
//
// Note that net/http's Transport itself re-sends a request that carries an
// Idempotency-Key header once when a kept-alive connection closes before any
// answer; the provider's deduplication is what makes that safe.
func (g *gatewayClient) charge(ctx context.Context, key string, amountCents int64, currency string) (fakegateway.Charge, error) {
	body, _ := json.Marshal(fakegateway.ChargeRequest{AmountCents: amountCents, Currency: currency}) // cannot fail
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return fakegateway.Charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := g.client.Do(req)
	if err != nil {
		return fakegateway.Charge{}, fmt.Errorf("%w: %w", errGatewayUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	switch {
	case err != nil:
		return fakegateway.Charge{}, fmt.Errorf("%w: reading the answer: %w", errGatewayUnavailable, err)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusConflict:
		return fakegateway.Charge{}, fmt.Errorf("%w: %d", errGatewayUnavailable, resp.StatusCode)
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated:
		return fakegateway.Charge{}, &gatewayRefused{status: resp.StatusCode, body: string(bytes.TrimSpace(b))}
	}
	var c fakegateway.Charge
	if err := json.Unmarshal(b, &c); err != nil || c.ID == "" {
		return fakegateway.Charge{}, &gatewayRefused{status: resp.StatusCode, body: "unreadable charge: " + string(b)}
	}
	if c.AmountCents != amountCents || c.Currency != currency {
		return fakegateway.Charge{}, &gatewayRefused{status: resp.StatusCode, body: fmt.Sprintf("charge %s is for %d %s", c.ID, c.AmountCents, c.Currency)}
	}
	return c, nil
}
