package watchfeed_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts/watchfeed"
)

var (
	org, typ   = uuid.New(), uuid.New()
	alice, bob = uuid.New(), uuid.New()
)

func key(id uuid.UUID) celeriant.AggregateKey {
	return celeriant.AggregateKey{Org: org, Type: typ, ID: id}
}

func write(t testing.TB, es celeriant.EventStore, id uuid.UUID) uint64 {
	t.Helper()
	res, err := es.Write(context.Background(), celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
		Key: key(id), Events: []celeriant.Event{{ClientSeq: 1, TypeMajor: 1, Value: []byte("x")}}, AllowCreate: true,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Version
}

// startFeed starts a feed over w watching alice and bob and serves it.
func startFeed(t testing.TB, w celeriant.Watcher, opts watchfeed.Options) (*watchfeed.Feed, *httptest.Server) {
	t.Helper()
	opts.Org, opts.Type, opts.Accounts = org, typ, []uuid.UUID{alice, bob}
	f, err := watchfeed.New(w, opts)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(context.Background())
	t.Cleanup(f.Close)
	select {
	case <-f.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the feed never subscribed")
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

// sse is one SSE connection read line by line.
type sse struct {
	t    testing.TB
	resp *http.Response
	r    *bufio.Reader
}

func connect(t testing.TB, url string) *sse {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return &sse{t: t, resp: resp, r: bufio.NewReader(resp.Body)}
}

// next returns the next event's lines (comment lines included), up to the blank
// line that ends it.
func (s *sse) next() []string {
	s.t.Helper()
	var lines []string
	for {
		l, err := s.r.ReadString('\n')
		if err != nil {
			s.t.Fatalf("reading the stream after %q: %v", lines, err)
		}
		l = strings.TrimSuffix(l, "\n")
		if l == "" {
			return lines
		}
		lines = append(lines, l)
	}
}

type payload struct {
	AggregateID        uuid.UUID `json:"aggregateId"`
	Operation          string    `json:"operation"`
	ToAggregateVersion uint64    `json:"toAggregateVersion"`
}

// data returns the next data event's payload, skipping comments.
func (s *sse) data() payload {
	s.t.Helper()
	for {
		lines := s.next()
		if len(lines) == 1 && strings.HasPrefix(lines[0], "data: ") {
			var p payload
			if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[0], "data: ")), &p); err != nil {
				s.t.Fatalf("data %q: %v", lines[0], err)
			}
			return p
		}
		for _, l := range lines {
			if !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "retry: ") {
				s.t.Fatalf("unexpected event %q: want data lines, comments or retry only (no event names)", lines)
			}
		}
	}
}

// TestStream: the headers a proxy needs, an unnamed data event per commit to a
// watched account with the reference's payload, nothing for other accounts,
// heartbeat comments, and the stream ends when the browser leaves or the feed stops.
func TestStream(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	f, srv := startFeed(t, sim, watchfeed.Options{Heartbeat: 50 * time.Millisecond})
	s := connect(t, srv.URL)
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := s.resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if first := s.next(); len(first) != 2 || first[0] != "retry: 2000" || first[1] != ": connected" {
		t.Fatalf("first event %q", first)
	}
	write(t, sim, uuid.New()) // not watched
	v := write(t, sim, alice)
	if got := s.data(); got != (payload{alice, "Write", v}) {
		t.Fatalf("event %+v, want alice at version %d", got, v)
	}
	write(t, sim, bob)
	if got := s.data(); got.AggregateID != bob || got.ToAggregateVersion != 1 {
		t.Fatalf("event %+v, want bob at version 1", got)
	}
	if hb := s.next(); len(hb) != 1 || hb[0] != ": heartbeat" {
		t.Fatalf("after a quiet %v: %q, want a heartbeat comment", 50*time.Millisecond, hb)
	}

	_ = s.resp.Body.Close() // the browser leaves
	for deadline := time.Now().Add(10 * time.Second); f.Clients() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream of a closed connection is still registered")
		}
	}
	s2 := connect(t, srv.URL)
	s2.next()
	f.Close()
	if _, err := s2.r.ReadString('\n'); err == nil {
		t.Fatal("the stream goes on after the feed stopped")
	}
}

// TestResubscribeAnnouncesAccounts: when the watch ends (here the event store drops
// every connection), the feed subscribes again and tells each browser every
// account's current version, so a commit made while it was not subscribed is not
// missed.
func TestResubscribeAnnouncesAccounts(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := celeriant.New(celeriant.Config{Addrs: []string{ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	versions := func(ctx context.Context, acct uuid.UUID) (uint64, error) {
		d, err := sim.AggregateDetails(ctx, key(acct))
		return d.MaxVersion, err
	}
	// The pause before resubscribing makes the write below land while the feed is
	// not subscribed: only the announcement can bring it.
	_, srv := startFeed(t, c, watchfeed.Options{RetryDelay: 300 * time.Millisecond, Versions: versions})
	s := connect(t, srv.URL)
	s.next()
	write(t, sim, bob)
	if got := s.data(); got.AggregateID != bob {
		t.Fatalf("event %+v, want bob", got)
	}
	sim.CloseConnections() // the subscription ends
	for deadline := time.Now().Add(10 * time.Second); sim.Watchers() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the subscription survived the dropped connections")
		}
	}
	v := write(t, sim, alice)
	seen := map[uuid.UUID]uint64{}
	for seen[alice] < v {
		p := s.data()
		seen[p.AggregateID] = max(seen[p.AggregateID], p.ToAggregateVersion)
	}
}

func TestNewRefusesNoAccounts(t *testing.T) {
	if _, err := watchfeed.New(celeriantsim.New(celeriantsim.Options{}), watchfeed.Options{}); err != watchfeed.ErrNoAccounts {
		t.Fatalf("New without accounts: %v", err)
	}
}

func TestAppendEvent(t *testing.T) {
	got := string(watchfeed.AppendEvent(nil, alice, 42))
	want := `data: {"aggregateId":"` + alice.String() + `","operation":"Write","toAggregateVersion":42}` + "\n\n"
	if got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

// TestStreamOutlivesServerTimeouts: a server's ReadTimeout and WriteTimeout (the
// examples set 30 s and 60 s) do not cut the stream.
func TestStreamOutlivesServerTimeouts(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	f, _ := startFeed(t, sim, watchfeed.Options{})
	srv := httptest.NewUnstartedServer(f)
	// The ReadTimeout also bounds reading the request itself: at 50 ms a busy
	// machine could miss it before the handler runs. 1 s is a bound a request
	// of one line does not miss.
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = time.Second, time.Second
	srv.Start()
	t.Cleanup(srv.Close) // after the connection's cleanup: Close waits for it
	s := connect(t, srv.URL)
	s.next()
	time.Sleep(2500 * time.Millisecond) // past both timeouts: nothing to wait for but the clock
	v := write(t, sim, alice)
	if got := s.data(); got.AggregateID != alice || got.ToAggregateVersion != v {
		t.Fatalf("event %+v after the timeouts, want alice at %d", got, v)
	}
}
