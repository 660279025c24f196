package sweep

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// syncBuffer is a log destination safe for the sweeper's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStart: one sweep per interval, failures logged at Warn with the attrs,
// deletions at Debug, nothing after stop.
func TestStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		calls := 0
		results := []error{nil, errors.New("boom"), nil}
		stop := Start(t.Context(), time.Second, func(context.Context) (int64, error) {
			err := results[calls%len(results)]
			calls++
			return 3, err
		}, logger, "idemkey/test", "table", "t")
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		stop()
		stop()
		if calls != 3 {
			t.Fatalf("%d sweeps in 3 intervals, want 3", calls)
		}
		out := logs.String()
		for _, want := range []string{`level=WARN msg="idemkey/test: sweep failed" table=t deleted=3 err=boom`,
			`level=DEBUG msg="idemkey/test: swept expired records" table=t deleted=3`} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %q:\n%s", want, out)
			}
		}
		time.Sleep(5 * time.Second)
		if calls != 3 {
			t.Errorf("a sweep ran after stop")
		}
	})
}
