package accountsapp

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// TestRunRefusesPrecisionMismatch: a Celeriant server stamping microseconds while
// CELERIANT_TIMESTAMP_PRECISION says ms (the default) stops the service before it
// listens; with the matching setting it starts.
func TestRunRefusesPrecisionMismatch(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{Precision: celeriant.Microseconds})
	t.Cleanup(func() { _ = sim.Close() })
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"ADDR": "127.0.0.1:0", "CELERIANT_ADDR": ln.Addr().String()}
	var out strings.Builder
	err = Run(context.Background(), func(k string) string { return env[k] }, &out, slog.New(slog.DiscardHandler), memoryWire)
	if !errors.Is(err, celeriant.ErrPrecisionMismatch) || out.Len() != 0 {
		t.Fatalf("ms against a microsecond server: %v (printed %q), want ErrPrecisionMismatch before listening", err, out.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env["CELERIANT_TIMESTAMP_PRECISION"] = "us"
	done := make(chan error, 1)
	w := &lineWriter{lines: make(chan string, 1)}
	go func() {
		done <- Run(ctx, func(k string) string { return env[k] }, w, slog.New(slog.DiscardHandler), memoryWire)
	}()
	select {
	case line := <-w.lines:
		if !strings.HasPrefix(line, "listening on http://") {
			t.Fatalf("printed %q", line)
		}
	case err := <-done:
		t.Fatalf("us against a microsecond server: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("after shutdown: %v", err)
	}
}

// lineWriter hands the first write to a channel.
type lineWriter struct{ lines chan string }

func (w *lineWriter) Write(p []byte) (int, error) {
	select {
	case w.lines <- string(p):
	default:
	}
	return len(p), nil
}
