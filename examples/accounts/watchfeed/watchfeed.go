// Package watchfeed serves the account service's live updates as Server-Sent Events
// (GET /api/watch/stream, docs/account-service.md section 1.1): one Celeriant watch
// subscription per process, fanned out to every connected browser.
//
// Each SSE message is one unnamed event whose data is
//
//	{"aggregateId":"<account uuid>","operation":"Write","toAggregateVersion":<n>}
//
// as in the reference's Rust port: "account <id> has changed, up to version n; fetch
// it". A comment line (": heartbeat") is sent when nothing else was, every Heartbeat,
// so proxies and the browser keep the connection open. Every event is flushed as it
// is written, and the answer carries Cache-Control: no-cache and X-Accel-Buffering: no
// so a buffering proxy (nginx) passes it through at once.
//
// The feed learns of changes from Celeriant (docs/celeriant-protocol.md sections 4.9
// and 6.11), not from this process's own writes, so a browser connected to one
// replica sees the deposits made through any other replica of the same event store.
// A watch sees only what commits after it was acknowledged and the server drops a
// subscriber that falls behind; the feed then resubscribes after a pause (RetryDelay)
// and tells every connected browser that each account may have changed (one event
// per account with its current version), so nothing committed during the gap is
// missed. A browser that cannot keep up does not slow the others: pending updates are
// kept per account (the newest version wins), so a slow reader gets fewer, newer
// events, never an unbounded queue.
package watchfeed

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// Defaults of the Options.
const (
	DefaultHeartbeat    = 15 * time.Second
	DefaultRetryDelay   = 2 * time.Second
	DefaultWriteTimeout = 30 * time.Second
)

// Options configure a Feed; zero values take the defaults.
type Options struct {
	// Org and Type are the key parts of the watched aggregates (the accounts').
	Org, Type uuid.UUID
	// Accounts are the aggregate ids watched (the reference watches its seeded
	// accounts). At least one.
	Accounts []uuid.UUID
	// Heartbeat is the longest silence on an SSE stream before a comment line is
	// sent; default 15 s.
	Heartbeat time.Duration
	// RetryDelay is the pause before resubscribing after the watch ended or could not
	// be opened; default 2 s (the reference's). It is also the "retry:" hint sent to
	// browsers, in milliseconds.
	RetryDelay time.Duration
	// WriteTimeout bounds each write to a browser; a client that does not take an
	// event in that time is disconnected. Default 30 s.
	WriteTimeout time.Duration
	// Versions returns an account's current version, used to tell browsers what may
	// have changed after a resubscription; nil skips that (no event after a gap).
	Versions func(ctx context.Context, acct uuid.UUID) (uint64, error)
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Feed is the shared subscription and its SSE handler. Safe for concurrent use.
type Feed struct {
	w    celeriant.Watcher
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	clients map[*client]struct{}
	ready   chan struct{} // closed once the first subscription is acknowledged
	isReady bool

	stop context.CancelFunc
	done chan struct{} // closed when Close ran or the context of Start ended
	wg   sync.WaitGroup
}

// client is one connected browser: the accounts changed since its last write, with
// the newest version seen, and a wake-up signal.
type client struct {
	pending map[uuid.UUID]uint64
	order   []uuid.UUID
	wake    chan struct{}
}

// ErrNoAccounts is returned by New when Options.Accounts is empty.
var ErrNoAccounts = errors.New("watchfeed: Options.Accounts is empty")

// New returns a Feed over w; Start begins the subscription.
func New(w celeriant.Watcher, opts Options) (*Feed, error) {
	if len(opts.Accounts) == 0 {
		return nil, ErrNoAccounts
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Feed{w: w, opts: opts, log: opts.Logger, clients: make(map[*client]struct{}),
		ready: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start runs the subscription in the background until ctx ends or Close is called;
// then every SSE stream ends (so a server's graceful shutdown is not held up by them).
func (f *Feed) Start(ctx context.Context) {
	ctx, f.stop = context.WithCancel(ctx)
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		<-ctx.Done()
		close(f.done)
	}()
	go func() {
		defer f.wg.Done()
		f.run(ctx)
	}()
}

// Close stops the subscription and ends every SSE stream. Idempotent.
func (f *Feed) Close() {
	if f.stop != nil {
		f.stop()
		f.wg.Wait()
	}
}

// Ready is closed once the first subscription was acknowledged by Celeriant: from
// then on every commit to a watched account reaches the connected browsers.
func (f *Feed) Ready() <-chan struct{} { return f.ready }

// Clients returns the number of connected SSE streams.
func (f *Feed) Clients() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.clients)
}

func (f *Feed) run(ctx context.Context) {
	req := celeriant.WatchRequest{Orgs: []uuid.UUID{f.opts.Org}, AggregateTypes: []uuid.UUID{f.opts.Type},
		Aggregates: f.opts.Accounts, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}}
	for first := true; ; first = false {
		err := f.watch(ctx, req, !first)
		if ctx.Err() != nil {
			return
		}
		f.log.WarnContext(ctx, "watchfeed: watch ended; resubscribing", "err", err, "after", f.opts.RetryDelay)
		t := time.NewTimer(f.opts.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watch runs one subscription until it ends. resync: after the acknowledgement,
// announce every account's current version (what committed during the gap).
func (f *Feed) watch(ctx context.Context, req celeriant.WatchRequest, resync bool) error {
	s, err := f.w.Watch(ctx, req)
	if err != nil {
		return err
	}
	defer s.Close()
	f.mu.Lock()
	if !f.isReady {
		f.isReady = true
		close(f.ready)
	}
	f.mu.Unlock()
	if resync && f.opts.Versions != nil {
		for _, acct := range f.opts.Accounts {
			if v, err := f.opts.Versions(ctx, acct); err == nil {
				f.publish(acct, v)
			}
		}
	}
	for {
		res, err := s.Next(ctx)
		if err != nil {
			return err
		}
		for _, ev := range res.Events {
			if ev.Operation == celeriant.WatchWrite {
				f.publish(ev.Key.ID, ev.ToVersion)
			}
		}
	}
}

// publish records that acct changed up to version v for every connected browser.
func (f *Feed) publish(acct uuid.UUID, v uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.clients {
		old, ok := c.pending[acct]
		if !ok {
			c.order = append(c.order, acct)
		}
		c.pending[acct] = max(old, v)
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// take returns c's pending updates in arrival order and clears them.
func (f *Feed) take(c *client, buf []update) []update {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, acct := range c.order {
		buf = append(buf, update{acct, c.pending[acct]})
		delete(c.pending, acct)
	}
	c.order = c.order[:0]
	return buf
}

type update struct {
	acct    uuid.UUID
	version uint64
}

// AppendEvent appends the SSE message for an update of acct to version v:
// `data: {"aggregateId":"...","operation":"Write","toAggregateVersion":v}` and the
// blank line that ends the event.
func AppendEvent(dst []byte, acct uuid.UUID, v uint64) []byte {
	dst = append(dst, `data: {"aggregateId":"`...)
	dst = append(dst, acct.String()...)
	dst = append(dst, `","operation":"Write","toAggregateVersion":`...)
	dst = strconv.AppendUint(dst, v, 10)
	return append(dst, "}\n\n"...)
}

// ServeHTTP serves the SSE stream (GET and HEAD; other methods get 405 with Allow).
// It ends when the client goes away, a write times out, or the feed stops.
//
// A request with a body (a Content-Length other than 0, or chunked) is answered
// 400: the stream takes none, and lifting the read deadline for such a request
// would let a client that declares a body and never sends it hold the
// connection for good (net/http reads an unread body before it writes the
// answer). The refusal is written under the server's ReadTimeout, which bounds
// that read; a stream without a body then runs without one.
func (f *Feed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
		http.Error(w, "the event stream takes no request body", http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	c := &client{pending: make(map[uuid.UUID]uint64), wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.clients[c] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.clients, c)
		f.mu.Unlock()
	}()

	// The server's WriteTimeout would cut a long stream: each write gets its own
	// deadline. The stream reads nothing after the request: no read deadline either.
	_ = rc.SetReadDeadline(time.Time{})
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(f.opts.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	buf := []byte("retry: " + strconv.FormatInt(f.opts.RetryDelay.Milliseconds(), 10) + "\n: connected\n\n")
	w.WriteHeader(http.StatusOK)
	if !send(buf) {
		return
	}
	hb := time.NewTimer(f.opts.Heartbeat)
	defer hb.Stop()
	var ups []update
	for {
		select {
		case <-r.Context().Done():
			return
		case <-f.done:
			return
		case <-hb.C:
			if !send([]byte(": heartbeat\n\n")) {
				return
			}
		case <-c.wake:
			ups = f.take(c, ups[:0])
			for _, u := range ups { // one event, one flush
				if buf = AppendEvent(buf[:0], u.acct, u.version); !send(buf) {
					return
				}
			}
		}
		hb.Reset(f.opts.Heartbeat)
	}
}
