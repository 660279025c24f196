package dynamodb_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	awsdynamo "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/dynamodb"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
)

// TestNewRefusesMisconfiguration: bad options fail at construction with
// store.ErrInvalid, before any I/O.
func TestNewRefusesMisconfiguration(t *testing.T) {
	c := awsdynamo.New(awsdynamo.Options{Region: "us-east-1"}) // never used
	for name, opts := range map[string][]dynamodb.Option{
		"short table":     {dynamodb.WithTable("ab")},
		"long table":      {dynamodb.WithTable(strings.Repeat("t", 256))},
		"bad character":   {dynamodb.WithTable("records!")},
		"nil clock":       {dynamodb.WithClock(nil)},
		"zero poll":       {dynamodb.WithPollInterval(0, time.Second)},
		"max below first": {dynamodb.WithPollInterval(time.Second, time.Millisecond)},
	} {
		if _, err := dynamodb.New(c, opts...); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := dynamodb.New(nil); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	if s, err := dynamodb.New(c, dynamodb.WithTable("app.records-1_x")); err != nil || s.Table() != "app.records-1_x" {
		t.Errorf("New with a valid name: %v, %v", s, err)
	}
}

// TestItemLimit: with the longest scope and key and a set of headers, the
// largest body the store keeps round trips on the server (which refuses items
// over 400 KB), and every longer body, up to the middleware's 1 MiB default
// cap, is kept omitted: the record completes, a replay says the body was
// omitted, and nothing fails.
func TestItemLimit(t *testing.T) {
	c := dynamotest.Client(t, nil)
	s := dynamotest.Store(t, c, dynamotest.Table(t, c))
	h := http.Header{"Content-Type": {"application/octet-stream"}, "Location": {strings.Repeat("/l", 500)}}
	scope := strings.Repeat("s", store.MaxScopeLen)
	keep := dynamodb.MaxBody(store.ID{Scope: scope, Key: strings.Repeat("k", store.MaxKeyLen)}, h)
	if keep < 300*1024 || keep > dynamodb.MaxItemBytes {
		t.Fatalf("MaxBody = %d, want a little under %d", keep, dynamodb.MaxItemBytes)
	}
	for _, n := range []int{keep, keep + 1, dynamodb.MaxItemBytes, 1 << 20} {
		id := store.ID{Scope: scope, Key: strings.Repeat("k", store.MaxKeyLen-8) + store.NewToken().String()[:8]}
		r := store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour}
		res, err := s.Claim(t.Context(), r)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Claim: %+v %v", res, err)
		}
		body := bytes.Repeat([]byte{0xa5}, n)
		if err := s.Complete(t.Context(), id, res.Token, store.Response{Status: 200, Header: h, Body: body}, time.Hour); err != nil {
			t.Fatalf("Complete with a body of %d bytes: %v", n, err)
		}
		res, err = s.Claim(t.Context(), r)
		if err != nil || res.Outcome != store.Completed {
			t.Fatalf("replay: %+v %v", res, err)
		}
		if fits := n <= keep; fits != !res.Record.BodyOmitted || fits != bytes.Equal(res.Record.Body, body) {
			t.Errorf("body of %d bytes (keeps up to %d): came back as %d bytes, omitted %v", n, keep, len(res.Record.Body), res.Record.BodyOmitted)
		}
		if res.Record.Header.Get("Location") != h.Get("Location") {
			t.Errorf("body of %d bytes: headers lost", n)
		}
	}
}

// TestMigrate: Migrate is idempotent and tolerates a server without TTL
// (dynalite), where it reports TTL off.
func TestMigrate(t *testing.T) {
	c := dynamotest.Client(t, nil)
	table := dynamotest.Table(t, c)
	s := dynamotest.Store(t, c, table)
	on, err := s.Migrate(t.Context())
	if err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	t.Logf("TTL enabled: %v", on)
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	missing := dynamotest.Store(t, c, table+"_missing")
	if err := missing.Ping(t.Context()); err == nil {
		t.Fatal("Ping of a missing table = nil")
	}
}

// counter is an http.RoundTripper that counts the requests to DynamoDB by
// operation (the X-Amz-Target header) and, since it asks for them
// (ReturnConsumedCapacity TOTAL, added to each request), sums the capacity
// units the server reports (a refused write reports none).
type counter struct {
	next  http.RoundTripper
	mu    sync.Mutex
	ops   map[string]int
	units map[string]float64
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.IndexByte(op, '.')+1:]
	var in map[string]any
	if b, err := io.ReadAll(r.Body); err != nil || json.Unmarshal(b, &in) != nil {
		return nil, fmt.Errorf("counter: request body: %v", err)
	}
	in["ReturnConsumedCapacity"] = "TOTAL"
	b, _ := json.Marshal(in)
	r = r.Clone(r.Context())
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	resp, err := c.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var out struct {
		ConsumedCapacity struct{ CapacityUnits float64 }
	}
	_ = json.Unmarshal(body, &out) // errors carry none
	c.mu.Lock()
	c.ops[op]++
	c.units[op] += out.ConsumedCapacity.CapacityUnits
	c.mu.Unlock()
	return resp, err
}

func (c *counter) take() (map[string]int, map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops, units := c.ops, c.units
	c.ops, c.units = map[string]int{}, map[string]float64{}
	return ops, units
}

// TestRoundTrips counts the requests of each path, and the capacity units the
// server reports, for a realistic key and a 1 KiB JSON response
// (docs/stores.md quotes them), on dynalite and as on DynamoDB, whose refusal
// carries the refusing item (returnsItem): a first execution is one PutItem
// and one UpdateItem; a replay or a duplicate in flight is one PutItem refused,
// plus one GetItem on dynalite; a takeover adds one UpdateItem.
func TestRoundTrips(t *testing.T) {
	t.Run("dynalite", func(t *testing.T) {
		roundTrips(t, http.DefaultTransport, "PutItem GetItem")
	})
	t.Run("item returned with the refusal", func(t *testing.T) {
		roundTrips(t, &returnsItem{next: http.DefaultTransport}, "PutItem")
	})
}

// roundTrips checks the requests of each path over transport, where a refused
// claim costs refused.
func roundTrips(t *testing.T, transport http.RoundTripper, refused string) {
	cnt := &counter{next: transport, ops: map[string]int{}, units: map[string]float64{}}
	c := dynamotest.Client(t, cnt)
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := dynamotest.Store(t, c, dynamotest.Table(t, c), dynamodb.WithClock(clock))
	cnt.take()
	id := store.ID{Scope: "tenant-42", Key: "5b0e7c1e-8f4f-4b7e-9d7a-" + store.NewToken().String()[:12]}
	r := store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}},
		Body: bytes.Repeat([]byte("x"), 1024)}
	step := func(name string, want string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, units := cnt.take()
		var parts, cu []string
		for _, op := range []string{"PutItem", "GetItem", "UpdateItem", "DeleteItem"} {
			for range got[op] {
				parts = append(parts, op)
			}
			if got[op] > 0 {
				cu = append(cu, fmt.Sprintf("%s %g", op, units[op]))
			}
		}
		g := strings.Join(parts, " ")
		t.Logf("%-20s %-28s capacity units reported: %s", name, g, strings.Join(cu, ", "))
		if g != want {
			t.Errorf("%s: requests %q, want %q", name, g, want)
		}
	}
	var tok store.Token
	claim := func(want store.Outcome) func() error {
		return func() error {
			res, err := s.Claim(t.Context(), r)
			if err == nil && res.Outcome != want {
				t.Fatalf("claim: %v, want %v", res.Outcome, want)
			}
			tok = res.Token
			return err
		}
	}
	step("first claim", "PutItem", claim(store.Claimed))
	held := tok
	step("duplicate in flight", refused, claim(store.InFlight))
	step("renew", "UpdateItem", func() error { return s.Renew(t.Context(), id, held, time.Second) })
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	step("takeover", refused+" UpdateItem", claim(store.Claimed))
	holder := tok
	step("complete", "UpdateItem", func() error { return s.Complete(t.Context(), id, holder, resp, time.Hour) })
	step("replay", refused, claim(store.Completed))
	step("release refused", "DeleteItem", func() error {
		if err := s.Release(t.Context(), id, holder); !errors.Is(err, store.ErrLeaseLost) {
			return fmt.Errorf("release after complete: %v", err)
		}
		return nil
	})
}
