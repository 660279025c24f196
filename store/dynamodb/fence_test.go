package dynamodb_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/dynamodb"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
)

// clock is a settable clock for WithClock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// beforeUpdate is an http.RoundTripper that runs hook once, before the first
// UpdateItem it carries.
type beforeUpdate struct {
	once sync.Once
	hook func()
}

func (b *beforeUpdate) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".UpdateItem") {
		b.once.Do(b.hook)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestTakeoverFencedByTheTokenRead: a takeover writes only over the record it
// read. Between the read and the takeover's write, the record it read is
// released and the key claimed for another request, whose lease has already
// ended too: the takeover is refused (its condition names the token it read),
// and the claim answers Mismatch, instead of taking over another request's
// record under its own fingerprint.
func TestTakeoverFencedByTheTokenRead(t *testing.T) {
	hooked := &beforeUpdate{}
	c := dynamotest.Client(t, hooked)
	table := dynamotest.Table(t, c)
	clk := &clock{now: time.Now()}
	behind := &clock{now: clk.Now().Add(-time.Minute)} // a replica whose leases end early for the others
	s := dynamotest.Store(t, c, table, dynamodb.WithClock(clk.Now))
	other := dynamotest.Store(t, dynamotest.Client(t, nil), table, dynamodb.WithClock(behind.Now))
	id := store.ID{Key: "fence-" + store.NewToken().String()}
	fpA, fpX := store.Fingerprint{1}, store.Fingerprint{2}
	first, err := other.Claim(t.Context(), store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Second, Retention: time.Hour})
	if err != nil || first.Outcome != store.Claimed {
		t.Fatalf("first claim: %+v %v", first, err)
	}
	hooked.hook = func() {
		if err := other.Release(t.Context(), id, first.Token); err != nil {
			t.Errorf("release in between: %v", err)
		}
		res, err := other.Claim(t.Context(), store.ClaimRequest{ID: id, Fingerprint: fpX, Lease: time.Second, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Errorf("claim in between: %+v %v", res, err)
		}
	}
	res, err := s.Claim(t.Context(), store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Second, Retention: time.Hour})
	if err != nil || res.Outcome != store.Mismatch {
		t.Fatalf("takeover of a record replaced in between: %+v %v, want Mismatch", res, err)
	}
}

// TestExpiredRecordRefusesHolder: past the record's retention the holder's
// Complete, Renew and Release are refused (store.ErrLeaseLost), although no
// one claimed the key since and its item is still there (TTL deletion is lazy),
// and the next claim is a new key, for any request.
func TestExpiredRecordRefusesHolder(t *testing.T) {
	c := dynamotest.Client(t, nil)
	clk := &clock{now: time.Now()}
	s := dynamotest.Store(t, c, dynamotest.Table(t, c), dynamodb.WithClock(clk.Now))
	id := store.ID{Key: "expired-" + store.NewToken().String()}
	r := store.ClaimRequest{ID: id, Fingerprint: store.Fingerprint{1}, Lease: time.Second, Retention: time.Minute}
	res, err := s.Claim(t.Context(), r)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	clk.Add(time.Minute + time.Millisecond)
	resp := store.Response{Status: 200}
	for name, err := range map[string]error{
		"Complete": s.Complete(t.Context(), id, res.Token, resp, time.Hour),
		"Renew":    s.Renew(t.Context(), id, res.Token, time.Hour),
		"Release":  s.Release(t.Context(), id, res.Token),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s past the retention = %v, want ErrLeaseLost", name, err)
		}
	}
	r.Fingerprint = store.Fingerprint{2}
	if again, err := s.Claim(t.Context(), r); err != nil || again.Outcome != store.Claimed || again.Takeover {
		t.Fatalf("claim past the retention: %+v %v, want a new claim", again, err)
	}
}
