package memory_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// TestCachePeekMarkFill walks the cache methods through a key's life: a marker
// answers InFlight to its fingerprint only while its lease lives; its Complete
// makes it a record that answers Completed or Mismatch; Fill keeps a copy with
// the backstop's times, never over what the key holds, for its ttl.
func TestCachePeekMarkFill(t *testing.T) {
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now))
	id, other := store.ID{Scope: "t", Key: "k"}, store.ID{Scope: "t", Key: "filled"}
	fp, fp2 := store.Fingerprint{1}, store.Fingerprint{2}
	peek := func(id store.ID, fp store.Fingerprint) (store.ClaimResult, bool) {
		t.Helper()
		res, ok, err := s.Peek(ctx, id, fp)
		if err != nil {
			t.Fatal(err)
		}
		return res, ok
	}
	if _, ok := peek(id, fp); ok {
		t.Fatal("peek of an absent key answered")
	}
	tok := store.NewToken()
	if err := s.Mark(ctx, id, fp, tok, time.Second); err != nil {
		t.Fatal(err)
	}
	if res, ok := peek(id, fp); !ok || res.Outcome != store.InFlight || res.RetryAfter != time.Second {
		t.Fatalf("peek of a live marker: %+v %v", res, ok)
	}
	if _, ok := peek(id, fp2); ok {
		t.Fatal("a marker answered another fingerprint (only the backstop decides it)")
	}
	if err := s.Renew(ctx, id, tok, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Second)
	if res, ok := peek(id, fp); !ok || res.Outcome != store.InFlight {
		t.Fatalf("peek of a renewed marker: %+v %v", res, ok)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Location": {"/o/1"}}, Body: []byte("done")}
	if err := s.Complete(ctx, id, tok, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, ok := peek(id, fp); !ok || res.Outcome != store.Completed || string(res.Record.Body) != "done" || res.Record.Header.Get("Location") != "/o/1" {
		t.Fatalf("peek of the completed marker: %+v %v", res, ok)
	}
	if res, ok := peek(id, fp2); !ok || res.Outcome != store.Mismatch {
		t.Fatalf("peek of a completed record with another fingerprint: %+v %v", res, ok)
	}

	// Fill leaves a key's record alone, and copies the backstop's record
	// under a new key with its times.
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := &store.Record{Fingerprint: fp2, Response: store.Response{Status: 200, Body: []byte("from the backstop")},
		CreatedAt: created, CompletedAt: created.Add(time.Second), ExpiresAt: created.Add(time.Hour)}
	if err := s.Fill(ctx, id, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, _ := peek(id, fp); res.Outcome != store.Completed || string(res.Record.Body) != "done" {
		t.Fatalf("Fill replaced a record: %+v", res)
	}
	if err := s.Fill(ctx, other, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	rec.Body[0] = 'X' // the caller's buffer: the copy must not change
	res, ok := peek(other, fp2)
	if !ok || res.Outcome != store.Completed || string(res.Record.Body) != "from the backstop" ||
		!res.Record.CreatedAt.Equal(created) || !res.Record.ExpiresAt.Equal(rec.ExpiresAt) || !res.Record.CompletedAt.Equal(rec.CompletedAt) {
		t.Fatalf("peek of a filled record: %+v %v", res.Record, ok)
	}
	c.Add(time.Minute)
	if _, ok := peek(other, fp2); ok {
		t.Fatal("a filled record outlived its ttl")
	}
	// A marker replaces whatever the key held.
	if err := s.Mark(ctx, id, fp2, store.NewToken(), time.Second); err != nil {
		t.Fatal(err)
	}
	if res, ok := peek(id, fp2); !ok || res.Outcome != store.InFlight {
		t.Fatalf("peek after a new marker: %+v %v", res, ok)
	}
}

// TestCacheBound: a full store keeps no new marker or copy (and says nothing:
// the backstop answers those keys), counts them refused, and still completes a
// marker it holds.
func TestCacheBound(t *testing.T) {
	s := memory.New(memory.WithMaxBytes(memory.RecordOverhead + 10))
	tok := store.NewToken()
	held := store.ID{Key: "held"}
	if err := s.Mark(ctx, held, store.Fingerprint{}, tok, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Mark(ctx, store.ID{Key: "new"}, store.Fingerprint{}, store.NewToken(), time.Second); err != nil {
		t.Fatalf("mark in a full cache: %v, want nil (nothing kept)", err)
	}
	rec := &store.Record{Response: store.Response{Status: 200}}
	if err := s.Fill(ctx, store.ID{Key: "copy"}, rec, time.Minute); err != nil {
		t.Fatalf("fill in a full cache: %v, want nil (nothing kept)", err)
	}
	if got := s.Stats(); got.Records != 1 || got.Refused != 2 {
		t.Fatalf("full cache: %+v, want the one marker and 2 refusals", got)
	}
	if err := s.Complete(ctx, held, tok, store.Response{Status: 200, Body: make([]byte, 100)}, time.Hour); err != nil {
		t.Fatalf("complete of a held marker in a full cache: %v", err)
	}
	if res, ok, err := s.Peek(ctx, held, store.Fingerprint{}); err != nil || !ok || res.Outcome != store.Completed {
		t.Fatalf("peek of the completed marker: %+v %v %v", res, ok, err)
	}
}

// TestCacheInvalid: the cache methods refuse what the store refuses, before
// touching anything.
func TestCacheInvalid(t *testing.T) {
	s := memory.New()
	for name, err := range map[string]error{
		"peek empty key":  func() error { _, _, err := s.Peek(ctx, store.ID{}, store.Fingerprint{}); return err }(),
		"mark zero token": s.Mark(ctx, store.ID{Key: "k"}, store.Fingerprint{}, store.Token{}, time.Second),
		"mark no lease":   s.Mark(ctx, store.ID{Key: "k"}, store.Fingerprint{}, store.NewToken(), 0),
		"fill nil":        s.Fill(ctx, store.ID{Key: "k"}, nil, time.Second),
		"fill no ttl":     s.Fill(ctx, store.ID{Key: "k"}, &store.Record{Response: store.Response{Status: 200}}, 0),
		"fill bad status": s.Fill(ctx, store.ID{Key: "k"}, &store.Record{}, time.Second),
	} {
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("refused calls left %d records", n)
	}
}
