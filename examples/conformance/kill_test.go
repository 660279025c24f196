package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// TestKillMidRequestPostgres is the crash scenario: the fixture runs as a
// process on the Postgres store, is killed with SIGKILL while a slow request
// holds its key, and is started again. A retry while the dead holder's lease is
// live gets 409 with Retry-After; the first retry after it runs the handler once;
// the next one replays.
func TestKillMidRequestPostgres(t *testing.T) {
	testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	if testing.Short() {
		t.Skip("-short: skipping the SIGKILL scenario")
	}
	const lease = 4 * time.Second
	env := storeEnv(t, "postgres")
	env["IDEM_LEASE"] = lease.String()
	bin := proctest.Build(t, ".", "conformance")
	procEnv := []string{"ADDR=127.0.0.1:0"}
	for k, v := range env {
		procEnv = append(procEnv, k+"="+v)
	}

	key := "kill-" + store.NewToken().String()
	clientID := "killer-" + store.NewToken().String()[:8]
	post := func(base string) (*http.Response, string, error) {
		req, err := http.NewRequest(http.MethodPost, base+"/slow?ms=1500", strings.NewReader(`{"n":1}`))
		if err != nil {
			return nil, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Client-ID", clientID)
		resp, err := client.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}

	// First life: the slow request claims the key, then the process dies.
	firstProc := proctest.Start(t, bin, procEnv...)
	first := firstProc.URL
	sent := time.Now()
	lost := make(chan error, 1)
	go func() { _, _, err := post(first); lost <- err }()
	proctest.WaitFor(t, "the slow handler to start", func() bool { return counter(t, first) == 1 })
	firstProc.Kill() // returns once the process is gone
	if err := <-lost; err == nil {
		t.Fatal("the slow request was answered although its server was killed")
	}

	// Second life: same store, fresh process.
	second := proctest.Start(t, bin, procEnv...).URL
	resp, body, err := post(second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("retry during the dead holder's lease: %d %s, want 409", resp.StatusCode, body)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || time.Duration(ra)*time.Second > lease+time.Second {
		t.Errorf("Retry-After %q, want 1..%v seconds", resp.Header.Get("Retry-After"), lease)
	}
	// Retry as a client would until the lease is over: 409s, then one execution.
	deadline := time.Now().Add(3 * lease)
	for resp.StatusCode == http.StatusConflict {
		if time.Now().After(deadline) {
			t.Fatalf("the key is still held %v after the kill (wedged)", 3*lease)
		}
		time.Sleep(250 * time.Millisecond) // waiting on the lease, which runs on Postgres's clock
		if resp, body, err = post(second); err != nil {
			t.Fatal(err)
		}
	}
	if resp.StatusCode != http.StatusOK || body != "slept:1500" || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the lease: %d %q replayed=%q, want a fresh 200 slept:1500",
			resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if since := time.Since(sent); since < lease {
		t.Errorf("the handler ran again %v after the first claim, before its %v lease ran out", since, lease)
	}
	if n := counter(t, second); n != 1 {
		t.Fatalf("handler ran %d times in the second process, want 1", n)
	}
	resp, body, err = post(second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || body != "slept:1500" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("next retry: %d %q replayed=%q, want the replay", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if n := counter(t, second); n != 1 {
		t.Fatalf("the replay ran the handler (count %d)", n)
	}
}
