// Package fakegateway is the payment provider the payments example charges
// through: a fake with a provider's idempotency keys and injectable faults. It
// serves
//
//	POST /charges  {"amountCents": n, "currency": "EUR"}, header Idempotency-Key
//	               201 {"id", "idempotencyKey", "amountCents", "currency"}
//	GET  /charges  200 [{"id", "idempotencyKey", "amountCents", "currency"}, ...]
//	               every charge, oldest first ("refunded": true once refunded)
//	POST /charges/{id}/refund  200 the charge, refunded (once: a second call
//	               refunds nothing and answers the same, Idempotent-Replayed: true)
//	GET  /events   200 [{"id", "type", "created", "data"}, ...] every event, oldest first
//	GET  /webhooks 200 {"events", "pending", "delivered", "attempts", "gaveUp"}
//
// Every charge is captured at once and emits a charge.succeeded event; a refund
// emits charge.refunded. With StartWebhooks (GATEWAY_WEBHOOK_URL) every event is
// POSTed there, signed (Sign, SignatureHeader), at least once as providers do:
// each of Webhooks.Deliveries copies until it is answered 2xx (retried with
// back-off), in random order with Webhooks.Shuffle.
//
// POST /charges deduplicates by key, as payment providers do: a second call with a
// key it has seen answers the first call's charge, with Idempotent-Replayed: true,
// and charges nothing; the same key with another amount or currency is a 422
// problem. A missing key or a malformed body is a 400 problem; fields other than
// amountCents and currency (a customer, a description) are accepted and ignored. Charges live in
// memory and die with the process.
//
// Faults (Faults; from the environment with FaultsFromEnv, per request from the
// query string of POST /charges, which overrides the environment):
//
//	GATEWAY_LATENCY     latency   Go duration added before every answer
//	GATEWAY_FAIL_RATE   fail      share (0 to 1) of calls answered 503 without charging
//	GATEWAY_LOSE_RATE   lose      share (0 to 1) of calls that charge, then break the
//	                              connection after the status line (a lost answer)
//	GATEWAY_LOSE_FIRST  loseFirst 1 or true: the first answer for every new key is lost
//	                              after charging (deterministic, for tests and demos)
package fakegateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Charge is one charge the gateway made.
type Charge struct {
	// ID is the gateway's charge id, "ch_" and 24 hex digits.
	ID string `json:"id"`
	// IdempotencyKey is the key the charge was made under.
	IdempotencyKey string `json:"idempotencyKey"`
	// AmountCents is the amount in the currency's minor unit; positive.
	AmountCents int64 `json:"amountCents"`
	// Currency is the ISO 4217 code, three upper-case letters.
	Currency string `json:"currency"`
	// Refunded reports a refund (POST /charges/{id}/refund); omitted while false.
	Refunded bool `json:"refunded,omitempty"`
}

// ChargeRequest is the body of POST /charges.
type ChargeRequest struct {
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
}

// Faults are the failures the gateway injects. The zero value injects none.
type Faults struct {
	// Latency is added before every answer to POST /charges.
	Latency time.Duration
	// FailRate is the share of calls, 0 to 1, answered 503 before charging.
	FailRate float64
	// LoseRate is the share of calls, 0 to 1, that charge (or find the key's
	// charge) and then break the connection after the answer's status line.
	LoseRate float64
	// LoseFirst loses the answer of the first call for every new key, after charging.
	LoseFirst bool
}

// FaultsFromEnv reads Faults from GATEWAY_LATENCY, GATEWAY_FAIL_RATE,
// GATEWAY_LOSE_RATE and GATEWAY_LOSE_FIRST; unset variables inject nothing. The
// error names the variable of a value that does not parse or is out of range.
func FaultsFromEnv(getenv func(string) string) (Faults, error) {
	return parseFaults(Faults{}, func(name string) string { return getenv(envNames[name]) }, func(name string) string { return envNames[name] })
}

var envNames = map[string]string{
	"latency": "GATEWAY_LATENCY", "fail": "GATEWAY_FAIL_RATE", "lose": "GATEWAY_LOSE_RATE", "loseFirst": "GATEWAY_LOSE_FIRST",
}

// parseFaults overrides base with the values get returns for the query names
// latency, fail, lose and loseFirst; label names a value in errors.
func parseFaults(base Faults, get func(string) string, label func(string) string) (Faults, error) {
	f := base
	if v := strings.TrimSpace(get("latency")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return f, fmt.Errorf("%s=%q: want a non-negative Go duration such as 50ms", label("latency"), v)
		}
		f.Latency = d
	}
	for _, r := range []struct {
		name string
		dst  *float64
	}{{"fail", &f.FailRate}, {"lose", &f.LoseRate}} {
		v := strings.TrimSpace(get(r.name))
		if v == "" {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || !(x >= 0 && x <= 1) {
			return f, fmt.Errorf("%s=%q: want a share from 0 to 1 such as 0.2", label(r.name), v)
		}
		*r.dst = x
	}
	if v := strings.TrimSpace(get("loseFirst")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, fmt.Errorf("%s=%q: want 1, 0, true or false", label("loseFirst"), v)
		}
		f.LoseFirst = b
	}
	if f.FailRate+f.LoseRate > 1 {
		return f, fmt.Errorf("%s + %s = %v: the shares add up to more than 1", label("fail"), label("lose"), f.FailRate+f.LoseRate)
	}
	return f, nil
}

// Gateway is the fake provider; build it with New. Safe for concurrent use.
type Gateway struct {
	faults Faults
	logger *slog.Logger

	mu      sync.Mutex
	charges []Charge
	byKey   map[string]int // index into charges
	byID    map[string]int // index into charges
	seq     uint64
	events  []*Event
	hooks   *webhookQueue // nil until StartWebhooks
}

// New returns a gateway that injects faults; a nil logger logs nowhere.
func New(faults Faults, logger *slog.Logger) *Gateway {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Gateway{faults: faults, logger: logger, byKey: make(map[string]int), byID: make(map[string]int)}
}

// Charges returns a copy of every charge, oldest first.
func (g *Gateway) Charges() []Charge {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append(make([]Charge, 0, len(g.charges)), g.charges...) // never nil: GET /charges answers [] when empty
}

// ServeHTTP serves POST /charges, GET /charges, POST /charges/{id}/refund,
// GET /events and GET /webhooks.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch id, isRefund := strings.CutPrefix(r.URL.Path, "/charges/"); {
	case isRefund && strings.HasSuffix(id, "/refund") && r.Method == http.MethodPost:
		g.refund(w, strings.TrimSuffix(id, "/refund"))
		return
	case r.URL.Path == "/events" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, g.Events(), false)
		return
	case r.URL.Path == "/webhooks" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, g.WebhookStats(), false)
		return
	case r.URL.Path != "/charges":
		writeProblem(w, http.StatusNotFound, "not_found", "No such route; the gateway serves /charges, POST /charges/{id}/refund, GET /events and GET /webhooks.")
		return
	}
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, g.Charges(), false)
	case http.MethodPost:
		g.charge(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeProblem(w, http.StatusMethodNotAllowed, "method_not_allowed", "/charges takes GET and POST.")
	}
}

func (g *Gateway) charge(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	faults, err := parseFaults(g.faults, q.Get, func(name string) string { return name })
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "bad_fault", err.Error())
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		writeProblem(w, http.StatusBadRequest, "idempotency_key_missing", "POST /charges needs an Idempotency-Key header.")
		return
	}
	var req ChargeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)) // other fields are ignored, as providers do
	if err := dec.Decode(&req); err != nil || dec.More() {
		writeProblem(w, http.StatusBadRequest, "malformed_request", "The body must be one JSON object {\"amountCents\": n, \"currency\": \"EUR\"}.")
		return
	}
	if req.AmountCents <= 0 || len(req.Currency) != 3 {
		writeProblem(w, http.StatusUnprocessableEntity, "validation_error", "amountCents must be positive and currency a three-letter code.")
		return
	}
	if faults.Latency > 0 {
		t := time.NewTimer(faults.Latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	roll := rand.Float64()
	if roll < faults.FailRate {
		g.logger.Info("fault: 503 without charging", "idempotencyKey", key)
		writeProblem(w, http.StatusServiceUnavailable, "gateway_unavailable", "Injected failure: nothing was charged.")
		return
	}
	c, replayed, err := g.chargeOnce(key, req)
	if err != nil {
		writeProblem(w, http.StatusUnprocessableEntity, "key_reused_with_different_payload", err.Error())
		return
	}
	if (faults.LoseFirst && !replayed) || roll < faults.FailRate+faults.LoseRate {
		g.logger.Info("fault: answer lost after charging", "idempotencyKey", key, "charge", c.ID)
		loseAnswer(w)
		return
	}
	writeJSON(w, http.StatusCreated, c, replayed)
}

// chargeOnce returns the key's charge, making it if the key is new; replayed
// reports that it already existed.
func (g *Gateway) chargeOnce(key string, req ChargeRequest) (c Charge, replayed bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i, ok := g.byKey[key]; ok {
		c = g.charges[i]
		if c.AmountCents != req.AmountCents || c.Currency != req.Currency {
			return Charge{}, true, errors.New("This idempotency key was used for a charge with another amount or currency.")
		}
		return c, true, nil
	}
	g.seq++
	c = Charge{ID: fmt.Sprintf("ch_%08x%016x", g.seq, rand.Uint64()), IdempotencyKey: key, AmountCents: req.AmountCents, Currency: req.Currency}
	g.byKey[key] = len(g.charges)
	g.byID[c.ID] = len(g.charges)
	g.charges = append(g.charges, c)
	g.emit(EventChargeSucceeded, c) // captured at once
	return c, false, nil
}

// Refund refunds the charge id once: it returns the refunded charge, and
// whether this call refunded it (false: it was refunded before, or id is
// unknown: ok is then false). The first refund emits EventChargeRefunded.
func (g *Gateway) Refund(id string) (c Charge, refunded, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, ok := g.byID[id]
	if !ok {
		return Charge{}, false, false
	}
	if g.charges[i].Refunded {
		return g.charges[i], false, true
	}
	g.charges[i].Refunded = true
	g.emit(EventChargeRefunded, g.charges[i])
	return g.charges[i], true, true
}

// refund serves POST /charges/{id}/refund: 200 with the refunded charge (a
// second refund answers the same, refunding nothing), 404 for an unknown id.
func (g *Gateway) refund(w http.ResponseWriter, id string) {
	c, refunded, ok := g.Refund(id)
	if !ok {
		writeProblem(w, http.StatusNotFound, "not_found", "No charge with this id.")
		return
	}
	writeJSON(w, http.StatusOK, c, !refunded)
}

// loseAnswer breaks the connection in the middle of the answer: the status line
// goes out, the rest never does. (A connection closed before any byte of an
// answer would be re-sent by net/http's Transport on its own when the request
// carries an Idempotency-Key and the connection was kept alive; a broken answer
// is not, so the caller sees the loss.)
func loseAnswer(w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil { // HTTP/2 cannot hijack: abort the stream instead
		panic(http.ErrAbortHandler)
	}
	_, _ = buf.WriteString("HTTP/1.1 201 Created\r\n")
	_ = buf.Flush()
	_ = conn.Close()
}

func writeJSON(w http.ResponseWriter, status int, v any, replayed bool) {
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(v) // charges only: cannot fail
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// writeProblem answers an RFC 9457 problem with the project's code member.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}{"urn:example:gateway:problem:" + code, http.StatusText(status), status, detail, code})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ChargesURL returns the POST /charges URL of the gateway at base (such as
// "http://127.0.0.1:9090" or "http://127.0.0.1:9090/?lose=0.2"): base's path
// joined with "charges", and base's query kept, so fault parameters in the base
// URL reach every call.
func ChargesURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("%q: want an http or https URL such as http://127.0.0.1:9090", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/charges"
	u.RawPath = ""
	u.Fragment = ""
	return u.String(), nil
}
