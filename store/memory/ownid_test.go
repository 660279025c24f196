package memory

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
	"weak"

	"github.com/idemkey/idemkey/store"
)

// TestRecordKeepsNoCallerMemory: a record keeps its scope and key in memory
// of its own, not the caller's. The Fiber adapters copy a request's method,
// URI, host, address and whole header block into one string, the key and a
// header scope slices of it; a record sharing it would keep every header
// (Authorization, cookies) for its retention, far past what WithMaxBytes
// counts (the scope and key lengths).
func TestRecordKeepsNoCallerMemory(t *testing.T) {
	ctx := context.Background()
	s := New()
	for name, keep := range map[string]func(id store.ID){
		"claim": func(id store.ID) {
			if _, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
		},
		"fill": func(id store.ID) {
			rec := &store.Record{Response: store.Response{Status: 200}}
			if err := s.Fill(ctx, id, rec, time.Hour); err != nil {
				t.Fatal(err)
			}
		},
		"mark": func(id store.ID) {
			if err := s.Mark(ctx, id, store.Fingerprint{}, store.Token{1}, time.Minute); err != nil {
				t.Fatal(err)
			}
		},
	} {
		for _, scoped := range []bool{true, false} {
			w := sharedID(name, scoped, keep)
			for range 3 {
				runtime.GC()
			}
			if w.Value() != nil {
				t.Errorf("%s (scope %v): the store keeps the caller's whole string alive through the record's ID", name, scoped)
			}
			if _, ok, _ := s.Peek(ctx, store.ID{Scope: scopeOf(name, scoped), Key: name + "-key"}, store.Fingerprint{}); !ok && name != "claim" {
				t.Errorf("%s: record not found by an equal ID", name)
			}
		}
	}
}

func scopeOf(name string, scoped bool) string {
	if scoped {
		return name + "-scope"
	}
	return ""
}

// sharedID passes keep an ID sliced from a large string, as the Fiber bridge
// hands the core, and returns a weak pointer to that string's memory.
//
//go:noinline
func sharedID(name string, scoped bool, keep func(store.ID)) weak.Pointer[byte] {
	scope := scopeOf(name, scoped)
	all := strings.Repeat("Authorization: Bearer secret\r\n", 1<<10) + scope + name + "-key"
	n := len(all) - len(scope) - len(name+"-key")
	keep(store.ID{Scope: all[n : n+len(scope)], Key: all[n+len(scope):]})
	return weak.Make(unsafe.StringData(all))
}
