package celeriantsim

import (
	"context"
	"encoding/binary"
	"math/bits"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

func (s *Sim) shard(k celeriant.AggregateKey) uint64 {
	hi := binary.BigEndian.Uint64(k.ID[:8])
	lo := binary.BigEndian.Uint64(k.ID[8:])
	return bits.Rem64(hi%uint64(s.opts.Shards), lo, uint64(s.opts.Shards))
}

// serveWrite runs one write through the pipeline. lost reports that its answer must be
// dropped. It may block on an injected delay or a Hold.
func (s *Sim) serveWrite(ctx context.Context, req *celeriant.WriteRequest) (res celeriant.WriteResult, err error, lost bool) {
	s.mu.Lock()
	s.stats.Writes++
	var fault writeFault
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	s.mu.Unlock()
	lost = fault.lose
	if err := s.wait(ctx); err != nil {
		return res, err, lost
	}

	s.mu.Lock()
	if fault.code != 0 {
		e := celeriant.NewServerError(fault.code, s.faultMessage(fault, req))
		e.CorrelationID = req.CorrelationID
		s.mu.Unlock()
		return res, e, lost
	}
	versions, serr := s.validateAndPrepare(req)
	if serr != nil && s.cluster != nil && visibilityGap(serr.Code) {
		// A leader waits once for what is replicating and checks again, so that a
		// commit in flight does not cause a false rejection.
		s.stats.Rechecks++
		s.awaitInflightLocked(ctx)
		versions, serr = s.validateAndPrepare(req)
	}
	if serr != nil {
		s.mu.Unlock()
		serr.CorrelationID = req.CorrelationID
		return res, serr, lost
	}
	var hold *Hold
	if len(s.holds) > 0 && !s.closed { // after Close nothing would commit the hold
		hold, s.holds = s.holds[0], s.holds[1:]
	}
	if hold == nil && s.opts.CommitDelay > 0 && !s.closed {
		hold = newHold()
		timer := time.AfterFunc(s.opts.CommitDelay, hold.Commit)
		defer timer.Stop()
	}
	if hold == nil {
		s.commitLocked(req, versions)
	} else {
		if len(s.active) == 0 {
			s.settled = make(chan struct{})
		}
		s.active[hold] = struct{}{}
	}
	s.mu.Unlock()
	if hold != nil {
		close(hold.prepared)
		<-hold.commit
		s.mu.Lock()
		delete(s.active, hold)
		if len(s.active) == 0 {
			close(s.settled)
		}
		s.commitLocked(req, versions)
		close(hold.done)
		s.mu.Unlock()
	}
	res.CorrelationID = req.CorrelationID
	if len(req.Writes) == 1 {
		res.Version = versions[0]
	}
	return res, nil, lost
}

func (s *Sim) faultMessage(f writeFault, req *celeriant.WriteRequest) string {
	if f.message != "" {
		return f.message
	}
	if len(req.Writes) == 0 {
		return "{}"
	}
	w := req.Writes[0]
	cur := uint64(0)
	if a := s.aggs[w.Key]; a != nil {
		cur = uint64(len(a.batches))
	}
	switch f.code {
	case celeriant.CodeWriteOCC:
		exp := uint64(0)
		if w.ExpectedVersion != nil {
			exp = *w.ExpectedVersion
		}
		return jsonMsg("expected_version", exp, "current_aggregate_version", cur)
	case celeriant.CodeWriteClientIdempotency, celeriant.CodeWriteInflightDuplicate:
		fl := uint64(0)
		if a := s.aggs[w.Key]; a != nil {
			fl = a.floors[req.ClientID].seq
		}
		return jsonMsg("last_client_seq", fl, "attempted_client_seq", minSeq(w.Events))
	}
	return "{}"
}

func minSeq(evs []celeriant.Event) uint64 {
	m := uint64(0)
	for i, e := range evs {
		if i == 0 || e.ClientSeq < m {
			m = e.ClientSeq
		}
	}
	return m
}

func maxSeq(evs []celeriant.Event) uint64 {
	m := uint64(0)
	for _, e := range evs {
		m = max(m, e.ClientSeq)
	}
	return m
}

// committedLen is the length of the committed prefix (the read cursor).
func (a *aggregate) committedLen() int {
	n := 0
	for n < len(a.batches) && a.batches[n].committed {
		n++
	}
	return n
}

// validateAndPrepare runs the checks of docs/celeriant-protocol.md sections 6.1 and 6.2 and, when all
// pass, appends the uncommitted batches and raises the floors. Caller holds s.mu.
func (s *Sim) validateAndPrepare(req *celeriant.WriteRequest) ([]uint64, *celeriant.ServerError) {
	if len(req.Writes) == 0 {
		return nil, celeriant.NewServerError(celeriant.CodeShardRoutingIncompatible,
			jsonMsg("detail", "Write request must contain at least one write operation.", "num_shards", s.opts.Shards))
	}
	sh := s.shard(req.Writes[0].Key)
	for _, w := range req.Writes[1:] {
		if s.shard(w.Key) != sh {
			return nil, celeriant.NewServerError(celeriant.CodeShardRoutingMultipleShards, jsonMsg("num_shards", s.opts.Shards))
		}
	}
	for _, w := range req.Writes {
		if len(w.Events) == 0 {
			return nil, celeriant.NewServerError(celeriant.CodeWriteEmptyEventsList, "{}")
		}
		for _, e := range w.Events {
			if e.TypeMajor == 0 {
				return nil, celeriant.NewServerError(celeriant.CodeWriteZeroEventType, jsonMsg("client_seq", e.ClientSeq))
			}
		}
	}
	for _, w := range req.Writes {
		a := s.aggs[w.Key]
		cur := uint64(0)
		if a != nil {
			cur = uint64(len(a.batches))
		}
		if cur == 0 && !w.AllowCreate {
			return nil, celeriant.NewServerError(celeriant.CodeWriteAggregateNotExists, "{}")
		}
		if w.ExpectedVersion != nil && *w.ExpectedVersion != cur {
			return nil, celeriant.NewServerError(celeriant.CodeWriteOCC, jsonMsg("expected_version", *w.ExpectedVersion, "current_aggregate_version", cur))
		}
		if w.EnforceClientIdempotency && a != nil {
			f := a.floors[req.ClientID]
			if lo := minSeq(w.Events); f.seq > 0 && lo <= f.seq {
				code := celeriant.CodeWriteClientIdempotency
				if f.version > uint64(a.committedLen()) {
					code = celeriant.CodeWriteInflightDuplicate
				}
				return nil, celeriant.NewServerError(code, jsonMsg("last_client_seq", f.seq, "attempted_client_seq", lo))
			}
		}
	}
	now := s.opts.Precision.Timestamp(s.opts.Now())
	versions := make([]uint64, len(req.Writes))
	for i, w := range req.Writes {
		a := s.aggs[w.Key]
		if a == nil {
			a = &aggregate{minVersion: 1, floors: make(map[uuid.UUID]floor)}
			s.aggs[w.Key] = a
		}
		seq := uint64(0)
		if n := len(a.batches); n > 0 {
			last := a.batches[n-1].Events
			seq = last[len(last)-1].EventSeq
		}
		for j := range w.Events {
			seq++
			w.Events[j].EventSeq = seq
		}
		v := uint64(len(a.batches)) + 1
		a.batches = append(a.batches, batch{Batch: celeriant.Batch{
			Version: v, ClientID: req.ClientID, UserID: req.UserID, ServerTimestamp: now, Events: w.Events,
		}})
		if m := maxSeq(w.Events); m > a.floors[req.ClientID].seq {
			a.floors[req.ClientID] = floor{seq: m, version: v}
		}
		versions[i] = v
	}
	return versions, nil
}

// commitLocked makes a prepared write visible and notifies the watchers, in the
// server's order: Create (a first batch) before Write.
func (s *Sim) commitLocked(req *celeriant.WriteRequest, versions []uint64) {
	for i, w := range req.Writes {
		s.aggs[w.Key].batches[versions[i]-1].committed = true
	}
	for i, w := range req.Writes {
		if versions[i] == 1 {
			s.notifyLocked(celeriant.WatchEvent{Key: w.Key, Operation: celeriant.WatchCreate})
		}
	}
	for i, w := range req.Writes {
		s.notifyLocked(celeriant.WatchEvent{Key: w.Key, Operation: celeriant.WatchWrite, FromVersion: versions[i], ToVersion: versions[i]})
	}
}
