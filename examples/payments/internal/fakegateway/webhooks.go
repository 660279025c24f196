package fakegateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Event types the gateway sends.
const (
	// EventChargeSucceeded: the charge was captured (the gateway captures every
	// charge right after making it).
	EventChargeSucceeded = "charge.succeeded"
	// EventChargeRefunded: the charge was refunded (POST /charges/{id}/refund).
	EventChargeRefunded = "charge.refunded"
)

// SignatureHeader carries an event's signature, "t=<unix seconds>,v1=<hex>":
// v1 is HMAC-SHA256, keyed with the webhook secret, over "<t>.<body>". The
// timestamp is the delivery attempt's, so a receiver can refuse old copies.
const SignatureHeader = "Gateway-Signature"

// Event is the body of a webhook delivery.
type Event struct {
	// ID is the event's id, "evt_" and 24 hex digits: the same on every
	// delivery of the event, different between events.
	ID string `json:"id"`
	// Type is EventChargeSucceeded or EventChargeRefunded.
	Type string `json:"type"`
	// Created is when the event happened, Unix seconds.
	Created int64 `json:"created"`
	// Data is the charge the event is about, as it was then.
	Data Charge `json:"data"`
}

// Sign returns the SignatureHeader value of body signed with secret at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Webhooks configures the delivery of events. The zero value sends none.
type Webhooks struct {
	// URL receives every event as POST with a JSON Event body; "" sends none.
	URL string
	// Secret signs every delivery (SignatureHeader); required with URL.
	Secret string
	// Deliveries is how many copies of each event are delivered, each until
	// it is answered 2xx (at least once each): 1 or more, default 1.
	Deliveries int
	// Shuffle delivers the waiting copies in random order instead of oldest
	// first, so a refund can arrive before its charge's capture.
	Shuffle bool
}

// WebhooksFromEnv reads Webhooks from GATEWAY_WEBHOOK_URL, GATEWAY_WEBHOOK_SECRET,
// GATEWAY_WEBHOOK_DELIVERIES and GATEWAY_WEBHOOK_SHUFFLE; the error names the
// variable of a value that does not parse.
func WebhooksFromEnv(getenv func(string) string) (Webhooks, error) {
	w := Webhooks{URL: strings.TrimSpace(getenv("GATEWAY_WEBHOOK_URL")), Secret: getenv("GATEWAY_WEBHOOK_SECRET"), Deliveries: 1}
	if v := strings.TrimSpace(getenv("GATEWAY_WEBHOOK_DELIVERIES")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return w, fmt.Errorf("GATEWAY_WEBHOOK_DELIVERIES=%q: want an integer from 1 to 100", v)
		}
		w.Deliveries = n
	}
	if v := strings.TrimSpace(getenv("GATEWAY_WEBHOOK_SHUFFLE")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return w, fmt.Errorf("GATEWAY_WEBHOOK_SHUFFLE=%q: want 1, 0, true or false", v)
		}
		w.Shuffle = b
	}
	return w, w.check()
}

func (w Webhooks) check() error {
	if w.URL == "" {
		return nil
	}
	u, err := url.Parse(w.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("GATEWAY_WEBHOOK_URL=%q: want an http or https URL such as http://127.0.0.1:8080/webhooks", w.URL)
	case w.Secret == "":
		return fmt.Errorf("GATEWAY_WEBHOOK_SECRET is required with GATEWAY_WEBHOOK_URL: it signs every delivery")
	case w.Deliveries < 1:
		return fmt.Errorf("GATEWAY_WEBHOOK_DELIVERIES=%d: want at least 1", w.Deliveries)
	}
	return nil
}

// WebhookStats counts deliveries.
type WebhookStats struct {
	// Events is how many events happened.
	Events int `json:"events"`
	// Pending is how many copies wait for a 2xx (being delivered included).
	Pending int `json:"pending"`
	// Delivered is how many copies were answered 2xx.
	Delivered int `json:"delivered"`
	// Attempts is how many POSTs were made, failed ones included.
	Attempts int `json:"attempts"`
	// GaveUp is how many copies were dropped after maxAttempts failures.
	GaveUp int `json:"gaveUp"`
}

// copyOf is one copy of an event waiting for a 2xx.
type copyOf struct {
	ev        *Event
	body      []byte
	attempts  int
	notBefore time.Time
}

// Delivery policy of a copy that was not answered 2xx: retried after a delay
// doubling from retryMin to retryMax, at most maxAttempts times.
const (
	retryMin       = 20 * time.Millisecond
	retryMax       = time.Second
	maxAttempts    = 200
	deliverWorkers = 4
	deliverTimeout = 10 * time.Second
	pollWait       = 20 * time.Millisecond
)

// webhookQueue holds the copies to deliver; the Gateway's mu guards it.
type webhookQueue struct {
	cfg     Webhooks
	waiting []*copyOf
	busy    int // copies being delivered
	stats   WebhookStats
	wake    chan struct{}
}

// StartWebhooks delivers every event the gateway makes from now on to w.URL,
// from a few goroutines, until ctx is done. It returns an error for an invalid
// w (see WebhooksFromEnv), and does nothing for an empty w.URL. Call it once.
func (g *Gateway) StartWebhooks(ctx context.Context, w Webhooks) error {
	if w.Deliveries == 0 {
		w.Deliveries = 1
	}
	if err := w.check(); err != nil || w.URL == "" {
		return err
	}
	g.mu.Lock()
	g.hooks = &webhookQueue{cfg: w, wake: make(chan struct{}, 1)}
	g.mu.Unlock()
	client := &http.Client{Timeout: deliverTimeout}
	for range deliverWorkers {
		go g.deliverLoop(ctx, client)
	}
	return nil
}

// WebhookStats returns the delivery counters (zero without StartWebhooks).
func (g *Gateway) WebhookStats() WebhookStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hooks == nil {
		return WebhookStats{Events: len(g.events)}
	}
	s := g.hooks.stats
	s.Events, s.Pending = len(g.events), len(g.hooks.waiting)+g.hooks.busy
	return s
}

// Events returns a copy of every event, oldest first.
func (g *Gateway) Events() []Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Event, len(g.events))
	for i, e := range g.events {
		out[i] = *e
	}
	return out
}

// emit records an event about c and queues its copies; g.mu is held.
func (g *Gateway) emit(typ string, c Charge) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	ev := &Event{ID: "evt_" + hex.EncodeToString(b[:]), Type: typ, Created: time.Now().Unix(), Data: c}
	g.events = append(g.events, ev)
	q := g.hooks
	if q == nil {
		return
	}
	body, _ := json.Marshal(ev) // strings and integers: cannot fail
	for range q.cfg.Deliveries {
		q.waiting = append(q.waiting, &copyOf{ev: ev, body: body})
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// next takes a copy that is due, oldest first or at random (Shuffle), or
// returns the time to wait before one is.
func (g *Gateway) next() (*copyOf, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q, now := g.hooks, time.Now()
	due := make([]int, 0, len(q.waiting))
	wait := pollWait // a new copy wakes one worker; the others look again soon
	for i, c := range q.waiting {
		if d := c.notBefore.Sub(now); d > 0 {
			wait = min(wait, d)
			continue
		}
		due = append(due, i)
		if !q.cfg.Shuffle {
			break
		}
	}
	if len(due) == 0 {
		return nil, wait
	}
	i := due[0]
	if q.cfg.Shuffle {
		i = due[mrand.IntN(len(due))]
	}
	c := q.waiting[i]
	q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
	q.busy++
	return c, 0
}

func (g *Gateway) deliverLoop(ctx context.Context, client *http.Client) {
	for {
		c, wait := g.next()
		if c == nil {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-g.hooks.wake:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		ok := g.deliver(ctx, client, c)
		g.settle(c, ok)
	}
}

// deliver POSTs one copy, signed now, and reports a 2xx.
func (g *Gateway) deliver(ctx context.Context, client *http.Client, c *copyOf) bool {
	cfg := g.hooks.cfg // set once before the workers start
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(c.body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign([]byte(cfg.Secret), time.Now(), c.body))
	resp, err := client.Do(req)
	if err != nil {
		g.logger.Info("webhook delivery failed; retrying", "event", c.ev.ID, "type", c.ev.Type, "err", err)
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		g.logger.Debug("webhook answered non-2xx; retrying", "event", c.ev.ID, "type", c.ev.Type, "status", resp.StatusCode)
		return false
	}
	return true
}

// settle counts a delivered copy, or queues it again after a delay.
func (g *Gateway) settle(c *copyOf, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.hooks
	q.busy--
	q.stats.Attempts++
	c.attempts++
	switch {
	case ok:
		q.stats.Delivered++
	case c.attempts >= maxAttempts:
		q.stats.GaveUp++
		g.logger.Warn("webhook dropped after too many failed deliveries", "event", c.ev.ID, "attempts", c.attempts)
	default:
		c.notBefore = time.Now().Add(min(retryMax, retryMin<<min(c.attempts-1, 10)))
		q.waiting = append(q.waiting, c)
	}
}
