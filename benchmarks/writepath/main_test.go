package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

var allocSink []*[64]byte

//go:noinline
func allocSite(n int) {
	for range n {
		allocSink = append(allocSink, new([64]byte))
	}
}

// TestWriteAllocsIsComplete: -memprofile records every allocation up to the
// moment it is written, those since the last garbage collection included (the
// runtime publishes a cycle's allocations to the profile only when a collection
// ends).
func TestWriteAllocsIsComplete(t *testing.T) {
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but the ones below
	runtime.GC()
	allocSite(1000) // after the last collection
	var b bytes.Buffer
	if err := writeAllocsTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rec := range strings.Split(b.String(), "\n\n") {
		// "inuse objects: bytes [alloc objects: alloc bytes] @ stack", then the frames
		if !strings.Contains(rec, "allocSite") || !strings.Contains(rec, "[") {
			continue
		}
		head := rec[strings.Index(rec, "[")+1:]
		if c, err := strconv.Atoi(head[:strings.Index(head, ":")]); err == nil {
			n += c
		}
	}
	if n < 1000 {
		t.Fatalf("the profile has %d allocations at allocSite; want the 1000 made", n)
	}
}
