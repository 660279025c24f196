package celeriantsim

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// Watch defaults: the server's (docs/celeriant-protocol.md section 6.11).
const (
	// DefaultWatchQueue is the notifications a subscriber may have pending before it
	// is dropped (the server's MAX_PENDING_EVENTS).
	DefaultWatchQueue = 10000
	// DefaultMaxWatchers is the subscriber limit (the server's --max-watch-subscribers).
	DefaultMaxWatchers = 16384
	// DefaultMaxWatchLatency is the largest RequestedLatencyMs accepted (the server's
	// --max-requested-latency-ms).
	DefaultMaxWatchLatency = 2 * time.Second
)

var _ celeriant.Watcher = (*Sim)(nil)

// watcher is one subscription: its shard, filters (nil = all) and queue.
type watcher struct {
	shard             uint64
	orgs, types, aggs map[uuid.UUID]struct{}
	ops               map[celeriant.WatchOperation]struct{}
	latency           time.Duration
	ch                chan celeriant.WatchEvent // closed when the subscriber is dropped or closed
}

func idSet(ids []uuid.UUID) map[uuid.UUID]struct{} {
	if len(ids) == 0 {
		return nil
	}
	m := make(map[uuid.UUID]struct{}, len(ids))
	for _, id := range ids {
		m[id] = struct{}{}
	}
	return m
}

func (w *watcher) matches(ev *celeriant.WatchEvent) bool {
	in := func(m map[uuid.UUID]struct{}, id uuid.UUID) bool {
		if m == nil {
			return true
		}
		_, ok := m[id]
		return ok
	}
	if w.ops != nil {
		if _, ok := w.ops[ev.Operation]; !ok {
			return false
		}
	}
	return in(w.orgs, ev.Key.Org) && in(w.types, ev.Key.Type) && in(w.aggs, ev.Key.ID)
}

// Watch implements celeriant.Watcher in-process, with the server's rules
// (docs/celeriant-protocol.md section 6.11): routing to one shard (ShardID, else every
// id of Aggregates on one shard: 9002 without aggregates, 9001 across shards, both
// with num_shards), RequestedLatencyMs at most Options.MaxWatchLatency (8001), at
// most Options.MaxWatchers subscribers (8005). The subscription sees what commits
// after Watch returns, on its shard; one that falls Options.WatchQueue
// notifications behind is dropped, and its stream ends with ErrTransport after the
// notifications already queued.
func (s *Sim) Watch(ctx context.Context, req celeriant.WatchRequest) (celeriant.WatchStream, error) {
	if err := s.precheck(ctx, "watch"); err != nil {
		return nil, err
	}
	w, err := s.subscribe(&req)
	if err != nil {
		return nil, err
	}
	return &stream{s: s, w: w, done: make(chan struct{}), lastSend: time.Now()}, nil
}

// subscribe validates req and registers its watcher.
func (s *Sim) subscribe(req *celeriant.WatchRequest) (*watcher, *celeriant.ServerError) {
	fail := func(code celeriant.Code, msg string) (*watcher, *celeriant.ServerError) {
		e := celeriant.NewServerError(code, msg)
		e.CorrelationID = req.CorrelationID
		return nil, e
	}
	n := uint64(s.opts.Shards)
	var shard uint64
	switch {
	case req.ShardID != nil:
		if *req.ShardID >= n {
			return fail(celeriant.CodeShardRoutingIncompatible, jsonMsg("detail",
				"Invalid shard_id "+strconv.FormatUint(*req.ShardID, 10)+". Must be less than "+strconv.FormatUint(n, 10)+" (total number of shards).",
				"num_shards", n))
		}
		shard = *req.ShardID
	case len(req.Aggregates) == 0:
		return fail(celeriant.CodeShardRoutingIncompatible, jsonMsg("detail",
			"Must specify at least one aggregate. Server is setup to shard by aggregate.", "num_shards", n))
	default:
		shard = s.shard(celeriant.AggregateKey{ID: req.Aggregates[0]})
		for _, id := range req.Aggregates[1:] {
			if s.shard(celeriant.AggregateKey{ID: id}) != shard {
				return fail(celeriant.CodeShardRoutingMultipleShards, jsonMsg("num_shards", n))
			}
		}
	}
	if req.RequestedLatencyMs != nil && time.Duration(*req.RequestedLatencyMs)*time.Millisecond > s.opts.MaxWatchLatency {
		return fail(celeriant.CodeWatchLatencyTooHigh, jsonMsg("requested_ms", *req.RequestedLatencyMs, "max_ms", s.opts.MaxWatchLatency.Milliseconds()))
	}
	w := &watcher{shard: shard, orgs: idSet(req.Orgs), types: idSet(req.AggregateTypes), aggs: idSet(req.Aggregates),
		ch: make(chan celeriant.WatchEvent, s.opts.WatchQueue)}
	if len(req.Operations) > 0 {
		w.ops = make(map[celeriant.WatchOperation]struct{}, len(req.Operations))
		for _, o := range req.Operations {
			w.ops[o] = struct{}{}
		}
	}
	if req.RequestedLatencyMs != nil {
		w.latency = time.Duration(*req.RequestedLatencyMs) * time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fail(celeriant.CodeServerBusy, "{}") // not reached in-process: precheck ran first
	}
	if len(s.watchers) >= s.opts.MaxWatchers {
		return fail(celeriant.CodeWatchTooManySubscribers, jsonMsg("active_subscribers", len(s.watchers), "max_subscribers", s.opts.MaxWatchers))
	}
	s.watchers[w] = struct{}{}
	return w, nil
}

// notifyLocked hands ev to every matching watcher of its shard without blocking; a
// watcher whose queue is full is dropped (its channel closed), as the server drops a
// subscriber that cannot keep up. s.mu is held.
func (s *Sim) notifyLocked(ev celeriant.WatchEvent) {
	if len(s.watchers) == 0 {
		return
	}
	shard := s.shard(ev.Key)
	for w := range s.watchers {
		if w.shard != shard || !w.matches(&ev) {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			delete(s.watchers, w)
			close(w.ch)
			s.log.Debug("celeriantsim: watch subscriber dropped: it fell behind", "pending", cap(w.ch))
		}
	}
}

// unsubscribe removes w (idempotent).
func (s *Sim) unsubscribe(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.watchers[w]; ok {
		delete(s.watchers, w)
		close(w.ch)
	}
}

// closeWatchersLocked ends every subscription (Close). s.mu is held.
func (s *Sim) closeWatchersLocked() {
	for w := range s.watchers {
		delete(s.watchers, w)
		close(w.ch)
	}
}

// Watchers returns the number of open subscriptions.
func (s *Sim) Watchers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

// stream is an in-process subscription.
type stream struct {
	s        *Sim
	w        *watcher
	lastSend time.Time // the last frame with events; the acknowledgement counts, as on the server (a heartbeat does not)
	closeMu  sync.Mutex
	closed   bool
	done     chan struct{}
}

type mergeKey struct {
	key celeriant.AggregateKey
	op  celeriant.WatchOperation
}

// Next implements celeriant.WatchStream: the next notification (with a requested
// latency, every notification of the latency window, merged per aggregate and
// operation as the server merges them), or an empty frame after
// celeriant.WatchHeartbeat without notifications.
func (st *stream) Next(ctx context.Context) (celeriant.WatchResponse, error) {
	select {
	case <-st.done:
		return celeriant.WatchResponse{}, fmt.Errorf("watch: %w", celeriant.ErrClosed)
	default:
	}
	hb := time.NewTimer(st.s.opts.WatchHeartbeat)
	defer hb.Stop()
	var first celeriant.WatchEvent
	select {
	case ev, ok := <-st.w.ch:
		if !ok {
			return celeriant.WatchResponse{}, st.ended()
		}
		first = ev
	case <-hb.C:
		return celeriant.WatchResponse{}, nil
	case <-st.done:
		return celeriant.WatchResponse{}, fmt.Errorf("watch: %w", celeriant.ErrClosed)
	case <-ctx.Done():
		return celeriant.WatchResponse{}, fmt.Errorf("watch: %w", ctx.Err())
	}
	if st.w.latency <= 0 {
		return celeriant.WatchResponse{Events: []celeriant.WatchEvent{first}}, nil
	}
	// The server sends at most one frame per latency window, merging what arrives.
	evs := []celeriant.WatchEvent{first}
	at := map[mergeKey]int{{first.Key, first.Operation}: 0}
	if wait := st.w.latency - time.Since(st.lastSend); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
	collect:
		for {
			select {
			case ev, ok := <-st.w.ch:
				if !ok {
					break collect // deliver what was queued; the next call reports the end
				}
				if i, seen := at[mergeKey{ev.Key, ev.Operation}]; seen {
					evs[i] = merge(evs[i], ev)
					continue
				}
				at[mergeKey{ev.Key, ev.Operation}] = len(evs)
				evs = append(evs, ev)
			case <-t.C:
				break collect
			case <-st.done:
				return celeriant.WatchResponse{}, fmt.Errorf("watch: %w", celeriant.ErrClosed)
			case <-ctx.Done():
				return celeriant.WatchResponse{}, fmt.Errorf("watch: %w", ctx.Err())
			}
		}
	}
	st.lastSend = time.Now()
	return celeriant.WatchResponse{Events: evs}, nil
}

// merge folds b into a, as the server's accumulator does: a version range for
// writes, the latest trim point, one notification for the others.
func merge(a, b celeriant.WatchEvent) celeriant.WatchEvent {
	switch a.Operation {
	case celeriant.WatchWrite:
		a.FromVersion = min(a.FromVersion, b.FromVersion)
		a.ToVersion = max(a.ToVersion, b.ToVersion)
	case celeriant.WatchTrimStart:
		a.KeepFromVersion = b.KeepFromVersion
	}
	return a
}

// ended is the error of a stream whose channel was closed: Close, Sim.Close, or
// the subscriber was dropped for lagging.
func (st *stream) ended() error {
	select {
	case <-st.done:
		return fmt.Errorf("watch: %w", celeriant.ErrClosed)
	default:
	}
	st.s.mu.Lock()
	closed := st.s.closed
	st.s.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: watch: %w", celeriant.ErrTransport, celeriant.ErrClosed)
	}
	return fmt.Errorf("%w: watch: the subscriber fell %d notifications behind and was dropped", celeriant.ErrTransport, cap(st.w.ch))
}

// Close implements celeriant.WatchStream.
func (st *stream) Close() error {
	st.closeMu.Lock()
	defer st.closeMu.Unlock()
	if !st.closed {
		st.closed = true
		close(st.done)
		st.s.unsubscribe(st.w)
	}
	return nil
}
