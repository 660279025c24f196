package testclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
)

func TestClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := testclock.New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v, want %v", got, start)
	}
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now() moved without Add: %v", got)
	}
	c.Add(90 * time.Second)
	if got, want := c.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Add(90s) Now() = %v, want %v", got, want)
	}
	c.Add(-30 * time.Second)
	if got, want := c.Now(), start.Add(time.Minute); !got.Equal(want) {
		t.Fatalf("after Add(-30s) Now() = %v, want %v", got, want)
	}
}

func TestClockConcurrent(t *testing.T) {
	start := time.Unix(0, 0)
	c := testclock.New(start)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Add(time.Millisecond)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(800*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now() = %v, want %v", got, want)
	}
}
