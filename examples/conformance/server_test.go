package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// startServer runs the fixture in-process on a free port with env as its
// environment and returns its base URL once it prints its listening line.
func startServer(t *testing.T, env map[string]string) string {
	t.Helper()
	env["ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- run(ctx, func(k string) string { return env[k] }, pw, logger)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server stopped with %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil {
		t.Fatalf("server printed no listening line: %v (run: %v)", err, <-done)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok || !strings.HasPrefix(url, "http://") {
		t.Fatalf("unexpected first line %q", line)
	}
	return url
}

var client = &http.Client{Timeout: 30 * time.Second}
