package celeriantsim

import (
	"slices"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// visible returns the batches a reader sees: the committed prefix minus the read lag.
func (s *Sim) visible(a *aggregate) []batch {
	n := a.committedLen() - s.readLag
	if n < 0 {
		n = 0
	}
	return a.batches[:n]
}

func inRange(v uint64, lo, hi *uint64) bool {
	return (lo == nil || v >= *lo) && (hi == nil || v <= *hi)
}

func (s *Sim) serveRead(req *celeriant.ReadRequest) (celeriant.ReadResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Reads++
	if err := s.readFaultLocked(req.CorrelationID); err != nil {
		return celeriant.ReadResult{}, err
	}
	res := celeriant.ReadResult{CorrelationID: req.CorrelationID}
	fail := func(code celeriant.Code, msg string) (celeriant.ReadResult, error) {
		e := celeriant.NewServerError(code, msg)
		e.CorrelationID = req.CorrelationID
		return celeriant.ReadResult{}, e
	}
	a := s.aggs[req.Key]
	if a == nil {
		return fail(celeriant.CodeReadAggregateNotExists, "{}")
	}
	vis := s.visible(a)
	if len(vis) == 0 {
		return fail(celeriant.CodeReadAggregateNotExists, "{}")
	}
	f := &req.Filters
	if f.FromVersion < a.minVersion {
		return fail(celeriant.CodeReadUnavailableVersion, jsonMsg("requested", f.FromVersion, "minimum_available", a.minVersion))
	}
	size, kept := 0, 0 // the page's budget so far, in counted bytes and batches
	for i := f.FromVersion - 1; i < uint64(len(vis)); i++ {
		b := &vis[i].Batch
		if f.ToVersion != nil && b.Version > *f.ToVersion {
			break
		}
		if !batchMayMatch(b, f) {
			continue
		}
		n := batchSize(b)
		if kept > 0 && (size+n > s.opts.MaxResponseSize || s.opts.PageBatches > 0 && kept == s.opts.PageBatches) {
			res.NextVersion = b.Version
			break
		}
		size += n
		kept++
		var evs []celeriant.Event
		for _, e := range b.Events {
			if len(f.EventTypes) > 0 && !slices.Contains(f.EventTypes, e.TypeMajor) {
				continue
			}
			if !inRange(e.ClientSeq, f.MinClientSeq, f.MaxClientSeq) ||
				!inRange(e.Timestamp, f.MinEventTimestamp, f.MaxEventTimestamp) ||
				!inRange(e.EventSeq, f.MinEventSeq, f.MaxEventSeq) {
				continue
			}
			evs = append(evs, e)
		}
		if len(evs) == 0 {
			continue
		}
		out := *b
		out.Events = copyEvents(evs)
		res.Batches = append(res.Batches, out)
	}
	return res, nil
}

// encodedBound is at least the encoded body size of res: payloads plus the largest
// MessagePack form of every other field (83 bytes an event, 60 a batch, 33 the rest).
func encodedBound(res *celeriant.ReadResult) int {
	n := 100
	for _, b := range res.Batches {
		n += 100
		for _, e := range b.Events {
			n += 100 + len(e.Value)
		}
	}
	return n
}

// EventOverhead is what the simulator adds to an event's payload when it counts a page
// against Options.MaxResponseSize, an estimate of the server's stored form.
const EventOverhead = 64

func batchSize(b *celeriant.Batch) int {
	n := 0
	for _, e := range b.Events {
		n += len(e.Value) + EventOverhead
	}
	return n
}

// batchMayMatch applies the filters the server checks against a batch's summary before
// it counts the batch against the page budget: its version, client, user and server
// time, and the ranges of its events' sequences, timestamps and types. A batch that
// passes may still lose every event to the event-level filters.
func batchMayMatch(b *celeriant.Batch, f *celeriant.ReadFilters) bool {
	if (f.ExcludeClientID != uuid.Nil && b.ClientID == f.ExcludeClientID) ||
		(f.IncludeClientID != uuid.Nil && b.ClientID != f.IncludeClientID) ||
		(f.ExcludeUserID != uuid.Nil && b.UserID == f.ExcludeUserID) ||
		(f.IncludeUserID != uuid.Nil && b.UserID != f.IncludeUserID) ||
		!inRange(b.ServerTimestamp, f.MinServerTimestamp, f.MaxServerTimestamp) {
		return false
	}
	overlaps := func(get func(e *celeriant.Event) uint64, lo, hi *uint64) bool {
		mn, mx := get(&b.Events[0]), get(&b.Events[0])
		for i := range b.Events {
			mn, mx = min(mn, get(&b.Events[i])), max(mx, get(&b.Events[i]))
		}
		return (lo == nil || mx >= *lo) && (hi == nil || mn <= *hi)
	}
	if !overlaps(func(e *celeriant.Event) uint64 { return e.ClientSeq }, f.MinClientSeq, f.MaxClientSeq) ||
		!overlaps(func(e *celeriant.Event) uint64 { return e.Timestamp }, f.MinEventTimestamp, f.MaxEventTimestamp) ||
		!overlaps(func(e *celeriant.Event) uint64 { return e.EventSeq }, f.MinEventSeq, f.MaxEventSeq) {
		return false
	}
	return len(f.EventTypes) == 0 || slices.ContainsFunc(b.Events, func(e celeriant.Event) bool { return slices.Contains(f.EventTypes, e.TypeMajor) })
}

func (s *Sim) serveDetails(corr uuid.UUID, key celeriant.AggregateKey) (celeriant.AggregateDetails, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Details++
	if err := s.readFaultLocked(corr); err != nil {
		return celeriant.AggregateDetails{}, err
	}
	a := s.aggs[key]
	var vis []batch
	if a != nil {
		vis = s.visible(a)
	}
	if len(vis) == 0 {
		e := celeriant.NewServerError(celeriant.CodeExistsAggregateNotFound, "{}")
		e.CorrelationID = corr
		return celeriant.AggregateDetails{}, e
	}
	last := vis[len(vis)-1]
	return celeriant.AggregateDetails{
		CorrelationID:       corr,
		MinVersion:          a.minVersion,
		MaxVersion:          last.Version,
		MaxEventSeq:         last.Events[len(last.Events)-1].EventSeq,
		LastServerTimestamp: last.ServerTimestamp,
		LastClientID:        last.ClientID,
		LastUserID:          last.UserID,
	}, nil
}
