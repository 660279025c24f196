// Package celeriantsim is an in-memory Celeriant server with the client-visible semantics
// of docs/celeriant-protocol.md section 6, usable in-process (a *Sim is a celeriant.EventStore) or over
// TCP with the real wire protocol (Serve), plus fault injection for tests.
//
// What it reproduces: per-aggregate versions (+1 per write), the write pipeline's check
// order (routing 9002/9001, then 2000/2001 for every entry, then per aggregate existence
// 2005, version guard 2003, idempotency 2002/2013), all-or-nothing multi-aggregate
// writes, the per-(aggregate, client) sequence floor raised by every write (enforced or
// not), reads that see only committed batches with the 15 filters of section 4.5,
// paging by NextVersion, soft trim (1000 below the trim point), server timestamps from an
// injectable clock, and "close the connection without an answer" on malformed input.
// Like the server's amortised fsync, every write stays in flight for a few
// milliseconds by default (Options.CommitDelay, DefaultCommitDelay).
//
// Watch (Sim.Watch in-process, the Watch message over TCP) follows the server's rules of
// docs/celeriant-protocol.md section 6.11: notifications after commit, shard routing,
// heartbeats, latency batching and merging, dropping a subscriber that falls behind.
//
// Over TCP it answers the Identify handshake with API keys (Options.APIKeys,
// Options.RequireIdentity) and RSA identities (any key whose signed nonce verifies;
// writes and trims must then carry its client id), then compresses large answers, as
// the server does.
//
// What it leaves out: delete, list, schemas, compressed
// requests, replication lag and rollbacks (a Cluster has leader and followers; inject
// 2007/2012 with InjectWriteError), bincode (protocol version 2).
//
// Errors returned in-process are the ones the TCP client decodes: *celeriant.ServerError
// built with celeriant.NewServerError, celeriant.ErrOutcomeUnknown for a lost answer,
// celeriant.ErrNotSent for a request refused before sending.
package celeriantsim

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/sleep"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// Options configure a Sim. The zero value is a single-shard server with the real clock.
type Options struct {
	// Now is the server clock for batch server timestamps; default time.Now.
	Now func() time.Time
	// Precision is the unit of the batch server timestamps, the server's
	// --timestamp-precision (docs/celeriant-protocol.md section 6.8): ticks of Now
	// since the Unix epoch; default celeriant.Milliseconds.
	Precision celeriant.Precision
	// APIKeys are the server's API keys (standard base64 of celeriant.APIKeySize
	// bytes) and what each allows; a key rotated out is simply absent. With keys an
	// Identify must present one (10005 without, 10006 for a malformed, unknown or
	// revoked one), and a ReadOnly key's writes and trims get 10007. TCP only
	// (docs/celeriant-protocol.md section 1.3).
	APIKeys map[string]celeriant.AccessLevel
	// RequireIdentity is the server's --require-client-identity: a connection whose
	// first request is not Identify gets 10004 and is closed. TCP only.
	RequireIdentity bool
	// Shards is the shard count for multi-aggregate routing (aggregate id modulo Shards,
	// docs/celeriant-protocol.md section 6.9); default 1, where every multi-aggregate write is allowed.
	Shards int
	// PageBatches caps, in addition to MaxResponseSize, the batches of one read page
	// that pass the batch-level filters (as the byte budget counts them); 0 means no
	// cap. The event-level filters may then empty them, so a page can hold no batch
	// and still a NextVersion to go on from. A small value makes paging testable.
	PageBatches int
	// MaxResponseSize is the read page budget in bytes, the server's
	// --max-response-size; default DefaultMaxResponseSize (64 MiB). As on the server, the
	// batches of a page that pass the batch-level filters add up to at most this many
	// bytes, each counted as its events' payloads plus EventOverhead per event (the
	// server counts its stored form), and a page holds at least one batch. A response
	// whose encoded body is still over the limit (a batch larger than the budget) is
	// not sent at all, as on the server: over TCP the connection stays open and the
	// client waits for its deadline; in-process Read returns an error wrapping
	// celeriant.ErrTransport at once.
	MaxResponseSize int
	// CommitDelay keeps every write that passed validation in flight this long before
	// it commits and is answered, like the server's amortised fsync (--fsync-delay-us,
	// up to 4 ms by default): meanwhile its version and sequence floor are taken, so
	// another write gets 2003 or 2013, while reads and AggregateDetails do not see it
	// yet (docs/celeriant-protocol.md sections 6.2 and 6.5). Zero means
	// DefaultCommitDelay, so that code tested against the simulator meets the races a
	// server shows; NoCommitDelay (any negative value) commits before the answer, at
	// once, for a test that needs writes to land without a window and says why.
	CommitDelay time.Duration
	// IdleTimeout closes a TCP connection that sends nothing for this long; default 30 s
	// (the server's --client-connection-timeout-ms).
	IdleTimeout time.Duration
	// MaxRequestSize is the request frame body limit, in bytes; default 16 MiB. A larger
	// frame closes the connection without an answer, like the server.
	MaxRequestSize uint32
	// Logger receives connection-level events; default discards.
	Logger *slog.Logger
	// WatchQueue is how many notifications a watch subscriber may have pending
	// before it is dropped; default DefaultWatchQueue (the server's 10,000).
	WatchQueue int
	// MaxWatchers caps the open watch subscriptions (8005 beyond); default
	// DefaultMaxWatchers.
	MaxWatchers int
	// MaxWatchLatency caps WatchRequest.RequestedLatencyMs (8001 beyond); default
	// DefaultMaxWatchLatency (2 s).
	MaxWatchLatency time.Duration
	// WatchHeartbeat is the silence after which a watch stream yields an empty frame;
	// default celeriant.WatchHeartbeat (5 s).
	WatchHeartbeat time.Duration
}

// Stats counts the requests the simulator received (in-process and over TCP), including
// those answered with an error or a lost answer. Requests refused before reaching the
// server (ErrNotSent: client-side checks, Close, a context already done) are not counted,
// nor an in-process Read or AggregateDetails whose context ended during SetDelay's wait.
type Stats struct {
	// Writes counts write requests, injected faults and held writes included.
	Writes int
	// Reads counts Read requests, one per page (ReadAll of n pages counts n).
	Reads int
	// Details counts AggregateDetails requests.
	Details int
	// Rechecks counts writes a Cluster's leader rejected with 2002, 2003 or 2006 and
	// checked again after the writes in flight committed.
	Rechecks int
}

// Sim is the simulated server. All methods are safe for concurrent use.
type Sim struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	aggs      map[celeriant.AggregateKey]*aggregate
	faults    []writeFault
	readFault []writeFault
	readLag   int
	delay     time.Duration
	holds     []*Hold
	active    map[*Hold]struct{} // prepared holds not yet committed
	settled   chan struct{}      // closed while active is empty
	stats     Stats
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	watchers  map[*watcher]struct{}
	wg        sync.WaitGroup
	cluster   *clusterState // nil: a standalone node
}

type aggregate struct {
	batches    []batch // every prepared batch, ascending version; index i is version i+1
	minVersion uint64  // first readable version (trim point), 1 when untrimmed
	floors     map[uuid.UUID]floor
}

type batch struct {
	celeriant.Batch
	committed bool
}

// floor is the (aggregate, client) sequence floor and the version of the batch that set it.
type floor struct {
	seq, version uint64
}

type writeFault struct {
	code    celeriant.Code
	message string
	lose    bool
}

// New returns an empty simulator.
func New(opts Options) *Sim {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Shards <= 0 {
		opts.Shards = 1
	}
	if opts.CommitDelay == 0 {
		opts.CommitDelay = DefaultCommitDelay
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 30 * time.Second
	}
	if opts.MaxRequestSize == 0 {
		opts.MaxRequestSize = celeriant.DefaultMaxRequestSize
	}
	if opts.MaxResponseSize <= 0 {
		opts.MaxResponseSize = celeriant.DefaultMaxResponseSize
	}
	if opts.WatchQueue <= 0 {
		opts.WatchQueue = DefaultWatchQueue
	}
	if opts.MaxWatchers <= 0 {
		opts.MaxWatchers = DefaultMaxWatchers
	}
	if opts.MaxWatchLatency <= 0 {
		opts.MaxWatchLatency = DefaultMaxWatchLatency
	}
	if opts.WatchHeartbeat <= 0 {
		opts.WatchHeartbeat = celeriant.WatchHeartbeat
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sim{
		opts:      opts,
		log:       log,
		aggs:      make(map[celeriant.AggregateKey]*aggregate),
		active:    make(map[*Hold]struct{}),
		settled:   closedChan(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
		watchers:  make(map[*watcher]struct{}),
	}
}

var _ celeriant.EventStore = (*Sim)(nil)

// ---- fault injection ----

// InjectWriteError makes the next write be answered with code and message without being
// applied (validation is skipped). An empty message is filled with the JSON detail the
// server would send, computed from that write (2003: expected and current version;
// 2002/2013: floor and lowest sequence of the first aggregate; others: "{}"). Several
// calls queue up, one per write.
func (s *Sim) InjectWriteError(code celeriant.Code, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, writeFault{code: code, message: message})
}

// InjectReadError makes the next Read or AggregateDetails be answered with code and
// message (default "{}"), e.g. 2011 with {"leader_address":"host:port"} or 11000.
func (s *Sim) InjectReadError(code celeriant.Code, message string) {
	if message == "" {
		message = "{}"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readFault = append(s.readFault, writeFault{code: code, message: message})
}

// readFaultLocked pops the next read fault as an error, or returns nil.
func (s *Sim) readFaultLocked(corr uuid.UUID) error {
	if len(s.readFault) == 0 {
		return nil
	}
	f := s.readFault[0]
	s.readFault = s.readFault[1:]
	e := celeriant.NewServerError(f.code, f.message)
	e.CorrelationID = corr
	return e
}

// ForceConflict makes the next write fail with 2003.
func (s *Sim) ForceConflict() { s.InjectWriteError(celeriant.CodeWriteOCC, "") }

// ForceInflightDuplicate makes the next write fail with 2013.
func (s *Sim) ForceInflightDuplicate() {
	s.InjectWriteError(celeriant.CodeWriteInflightDuplicate, "")
}

// LoseNextWriteAnswer makes the next write run normally (it commits if valid) and then
// lose its answer: in-process the caller gets celeriant.ErrOutcomeUnknown, over TCP the
// connection is closed without a response, which the client reports the same way.
func (s *Sim) LoseNextWriteAnswer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, writeFault{lose: true})
}

// SetReadLag hides the newest n committed batches of every aggregate from reads and
// AggregateDetails, like a replica that is n writes behind; 0 turns it off.
func (s *Sim) SetReadLag(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readLag = max(n, 0)
}

// SetDelay makes every request wait d before the server processes it. The server
// processes it even if the caller gave up meanwhile (a write then commits although its
// caller saw ErrOutcomeUnknown).
func (s *Sim) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Trim soft-trims key: reads from below keepFrom then give 1000 (docs/celeriant-protocol.md section
// 6.7). keepFrom at or below the current minimum is a no-op; beyond the current version
// it is 3004; a missing aggregate is 3000, as the server answers a TrimStart.
func (s *Sim) Trim(key celeriant.AggregateKey, keepFrom uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.aggs[key]
	if a == nil || len(a.batches) == 0 {
		return celeriant.NewServerError(celeriant.CodeTrimAggregateNotExists, "{}")
	}
	if keepFrom <= a.minVersion {
		return nil
	}
	if cur := uint64(len(a.batches)); keepFrom > cur {
		return celeriant.NewServerError(celeriant.CodeTrimIndexOutOfRange, jsonMsg("requested", keepFrom, "max_aggregate_version", cur))
	}
	a.minVersion = keepFrom
	s.notifyLocked(celeriant.WatchEvent{Key: key, Operation: celeriant.WatchTrimStart, KeepFromVersion: keepFrom})
	return nil
}

// Stats returns the request counters.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// ---- EventStore ----

// Write implements celeriant.EventStore with the server's write pipeline (docs/celeriant-protocol.md
// sections 6.1-6.5). It applies the same client-side checks as the TCP client first. If
// ctx ends before the answer, the write still runs and the caller gets ErrOutcomeUnknown.
func (s *Sim) Write(ctx context.Context, req celeriant.WriteRequest) (celeriant.WriteResult, error) {
	if err := celeriant.CheckWrite(&req); err != nil {
		return celeriant.WriteResult{}, err
	}
	if err := s.precheck(ctx, "write"); err != nil {
		return celeriant.WriteResult{}, err
	}
	req = copyWrite(req)
	type out struct {
		res  celeriant.WriteResult
		err  error
		lost bool
	}
	ch := make(chan out, 1)
	go func() {
		res, err, lost := s.serveWrite(context.WithoutCancel(ctx), &req)
		ch <- out{res, err, lost}
	}()
	select {
	case o := <-ch:
		if o.lost {
			return celeriant.WriteResult{}, fmt.Errorf("%w: simulated lost answer", celeriant.ErrOutcomeUnknown)
		}
		return o.res, o.err
	case <-ctx.Done():
		return celeriant.WriteResult{}, fmt.Errorf("%w: write: %w", celeriant.ErrOutcomeUnknown, ctx.Err())
	}
}

// Read implements celeriant.EventStore (docs/celeriant-protocol.md sections 4.5, 4.6, 6.6). FromVersion
// 0 is read as 1, as the TCP client sends it.
func (s *Sim) Read(ctx context.Context, req celeriant.ReadRequest) (celeriant.ReadResult, error) {
	req, err := celeriant.CheckRead(req)
	if err != nil {
		return celeriant.ReadResult{}, err
	}
	if err := s.precheck(ctx, "read"); err != nil {
		return celeriant.ReadResult{}, err
	}
	if err := s.wait(ctx); err != nil {
		return celeriant.ReadResult{}, fmt.Errorf("%w: read: %w", celeriant.ErrTransport, err)
	}
	res, err := s.serveRead(&req)
	if err == nil && encodedBound(&res) > s.opts.MaxResponseSize {
		if n := len(wire.NewEncoder().ReadResponse(&res)) - wire.HeaderSize; n > s.opts.MaxResponseSize {
			// Over TCP the answer never comes (see Options.MaxResponseSize); in-process
			// the caller gets at once the error a client gets at its deadline.
			return celeriant.ReadResult{}, fmt.Errorf("%w: read: no answer: a %d-byte response is over the server's %d-byte limit",
				celeriant.ErrTransport, n, s.opts.MaxResponseSize)
		}
	}
	return res, err
}

// AggregateDetails implements celeriant.EventStore (docs/celeriant-protocol.md section 4.7).
func (s *Sim) AggregateDetails(ctx context.Context, key celeriant.AggregateKey) (celeriant.AggregateDetails, error) {
	if err := s.precheck(ctx, "aggregate details"); err != nil {
		return celeriant.AggregateDetails{}, err
	}
	if err := s.wait(ctx); err != nil {
		return celeriant.AggregateDetails{}, fmt.Errorf("%w: aggregate details: %w", celeriant.ErrTransport, err)
	}
	return s.serveDetails(uuid.Nil, key)
}

func (s *Sim) precheck(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %s: %w", celeriant.ErrNotSent, op, err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: %w: %s", celeriant.ErrNotSent, celeriant.ErrClosed, op)
	}
	return nil
}

// wait applies the injected delay.
func (s *Sim) wait(ctx context.Context) error {
	s.mu.Lock()
	d := s.delay
	s.mu.Unlock()
	if d <= 0 {
		return nil
	}
	return sleep.Ctx(ctx, d)
}

func copyWrite(req celeriant.WriteRequest) celeriant.WriteRequest {
	ws := make([]celeriant.AggregateWrite, len(req.Writes))
	for i, w := range req.Writes {
		if w.ExpectedVersion != nil {
			w.ExpectedVersion = celeriant.Version(*w.ExpectedVersion)
		}
		w.Events = copyEvents(w.Events)
		ws[i] = w
	}
	req.Writes = ws
	return req
}

func copyEvents(evs []celeriant.Event) []celeriant.Event {
	out := make([]celeriant.Event, len(evs))
	for i, e := range evs {
		e.Value = slices.Clone(e.Value)
		if e.Value == nil {
			e.Value = []byte{}
		}
		e.IV = slices.Clone(e.IV)
		out[i] = e
	}
	return out
}

// jsonMsg builds the server's JSON detail object with keys in the given order
// (alternating key, value), as the server formats them (docs/celeriant-protocol.md section 4.8).
func jsonMsg(kv ...any) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(kv[i])
		v, _ := json.Marshal(kv[i+1])
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.String()
}
