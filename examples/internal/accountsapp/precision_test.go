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
	env["CELERIANT_TIMESTAMP_PRECISION"] = "us"
	runUntilListening(t, env, slog.New(slog.DiscardHandler))
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

// TestRunWithAPIKey: against a Celeriant server requiring identity with API keys,
// the service without CELERIANT_API_KEY stops at startup with the server's 10004;
// with a key the server does not have, 10006; with its key it starts and serves;
// the key is in no output or log line.
func TestRunWithAPIKey(t *testing.T) {
	const key = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
	sim := celeriantsim.New(celeriantsim.Options{RequireIdentity: true, APIKeys: map[string]celeriant.AccessLevel{key: celeriant.ReadWrite}})
	t.Cleanup(func() { _ = sim.Close() })
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	env := map[string]string{"ADDR": "127.0.0.1:0", "CELERIANT_ADDR": ln.Addr().String()}
	for k, code := range map[string]celeriant.Code{"": celeriant.CodeIdentifyRequired,
		"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=": celeriant.CodeAuthInvalidKey} {
		env["CELERIANT_API_KEY"] = k
		var out strings.Builder
		err := Run(context.Background(), func(k string) string { return env[k] }, &out, logger, memoryWire)
		if celeriant.CodeOf(err) != code || out.Len() != 0 {
			t.Fatalf("key %q: %v (printed %q), want code %d before listening", k, err, out.String(), code)
		}
	}
	env["CELERIANT_API_KEY"] = key
	runUntilListening(t, env, logger)
	if strings.Contains(logs.String(), key) || strings.Contains(logs.String(), "AgICAgIC") {
		t.Fatalf("a key is in the logs: %s", logs.String())
	}
}

// runUntilListening runs the server on env until it prints its listening line, then
// shuts it down; it fails the test if the server stops first or shuts down with an
// error.
func runUntilListening(t *testing.T, env map[string]string, logger *slog.Logger) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	w := &lineWriter{lines: make(chan string, 1)}
	go func() { done <- Run(ctx, func(k string) string { return env[k] }, w, logger, memoryWire) }()
	select {
	case line := <-w.lines:
		if !strings.HasPrefix(line, "listening on http://") {
			t.Fatalf("printed %q", line)
		}
	case err := <-done:
		t.Fatalf("the server stopped: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("after shutdown: %v", err)
	}
}
