package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

type bench struct {
	cfg  serveConfig
	rc   *goredis.Client
	body []byte
	c    int
	d    time.Duration
	seq  int // requests of the sequential phase
}

// runResult is one (subject, mode) run.
type runResult struct {
	rps, cpuPerReq float64    // requests/s seen by the client; server CPU, µs per request
	redis          redisDelta // Redis under the concurrent load
	seq            redisDelta // Redis per request, one request at a time
}

// roundResult is one round: every run, and the plain GET and SET floor (one
// command at a time, as the sequential phase of the runs).
type roundResult struct {
	runs     map[string]runResult // by "subject/mode"
	get, set redisDelta
}

// round runs every subject once (bare) or in both modes, then the plain
// commands on the record the Redis subject stored.
func (b *bench) round(n int, subs []string) roundResult {
	res := roundResult{runs: map[string]runResult{}}
	fmt.Printf("\nround %d\n%-20s %9s %11s %9s %9s  %s\n", n, "run", "req/s", "cpu-us/req", "redis-us", "seq-us",
		"redis commands per request, one at a time (usec_per_call)")
	var record string
	for _, s := range subs {
		modes := []string{"first", "replay"}
		if strings.HasSuffix(s, "bare") || s == "get" || s == "getset" {
			modes = []string{"bare"}
		}
		for _, mode := range modes {
			prefix := "endtoend:" + store.NewToken().String()[:8] + ":"
			if s == "get" || s == "getset" {
				if record == "" {
					record = string(answer) // no Redis subject ran: the answer alone
				}
				prefix += "floor"
				if err := b.rc.Set(context.Background(), prefix, record, time.Hour).Err(); err != nil {
					fmt.Fprintf(os.Stderr, "round %d: %v\n", n, err)
					os.Exit(1)
				}
			}
			r, err := b.run(s, mode, prefix)
			if err != nil {
				fmt.Fprintf(os.Stderr, "round %d, %s/%s: %v\n", n, s, mode, err)
				os.Exit(1)
			}
			if s == "redis" && mode == "replay" {
				record = storedRecord(b.rc, prefix)
			}
			res.runs[s+"/"+mode] = r
			fmt.Printf("%-20s %9.0f %11.1f %9.2f %9.2f  %s\n", s+"/"+mode, r.rps, r.cpuPerReq, r.redis.cpuPerReq, r.seq.cpuPerReq, r.seq.commands())
		}
	}
	if record == "" {
		record = string(answer) // no Redis subject ran: the answer alone
	}
	get, set, err := plainOps(b.cfg.redisAddr, record, 1, b.seq)
	if err != nil {
		fmt.Fprintf(os.Stderr, "plain commands: %v\n", err)
		os.Exit(1)
	}
	res.get, res.set = get, set
	fmt.Printf("%-20s %9s %11s %9s %9.2f  %s (value of %d bytes)\n", "plain GET", "", "", "", get.cpuPerReq, get.commands(), len(record))
	fmt.Printf("%-20s %9s %11s %9s %9.2f  %s\n", "plain SET", "", "", "", set.cpuPerReq, set.commands())
	return res
}

// storedRecord returns the value the Redis subject keeps for its replayed key.
func storedRecord(c *goredis.Client, prefix string) string {
	ctx := context.Background()
	keys, _ := c.Keys(ctx, prefix+"*").Result()
	for _, k := range keys {
		if v, err := c.Get(ctx, k).Result(); err == nil {
			return v
		}
	}
	return ""
}

// run starts a server process for subject, warms it up, sends requests for
// b.d, stops the server and returns what it and Redis measured.
func (b *bench) run(subject, mode, prefix string) (runResult, error) {
	self, err := os.Executable()
	if err != nil {
		return runResult{}, err
	}
	cmd := exec.Command(self, "-serve", subject, "-redis", b.cfg.redisAddr, "-pg", b.cfg.pgURL,
		"-schema", b.cfg.schema, "-prefix", prefix)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return runResult{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return runResult{}, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	defer cmd.Process.Kill() // after Wait: a no-op
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening on http://") {
		return runResult{}, fmt.Errorf("server did not start: %q", lines.Text())
	}
	base := strings.TrimPrefix(lines.Text(), "listening on ")
	url := base + "/api/transfers"
	tr := &http.Transport{MaxIdleConnsPerHost: b.c, MaxConnsPerHost: b.c, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	replayKey := newKey(rand.Uint32(), 0, 0)
	if mode == "replay" {
		if err := send(cl, url, replayKey, b.body); err != nil {
			return runResult{}, err
		}
	}
	if _, err := b.load(cl, url, mode, replayKey, b.d/10); err != nil {
		return runResult{}, err
	}
	cpu0, err := serverCPU(cl, base)
	if err != nil {
		return runResult{}, err
	}
	rs0, err := readStats(b.rc)
	if err != nil {
		return runResult{}, err
	}
	rs0Load := rs0
	start := time.Now()
	n, err := b.load(cl, url, mode, replayKey, b.d)
	if err != nil {
		return runResult{}, err
	}
	elapsed := time.Since(start)
	rs1, err := readStats(b.rc)
	if err != nil {
		return runResult{}, err
	}
	cpu1, err := serverCPU(cl, base)
	if err != nil {
		return runResult{}, err
	}
	// One request at a time: Redis's CPU per request without the batching that
	// concurrent clients give it, comparable with plain commands sent alike.
	if rs0, err = readStats(b.rc); err != nil {
		return runResult{}, err
	}
	run := rand.Uint32()
	for i := range b.seq {
		key := replayKey
		if mode != "replay" {
			key = newKey(run, 0, i)
		}
		if err := send(cl, url, key, b.body); err != nil {
			return runResult{}, err
		}
	}
	seqStats, err := readStats(b.rc)
	if err != nil {
		return runResult{}, err
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		return runResult{}, err
	}
	return runResult{rps: float64(n) / elapsed.Seconds(), cpuPerReq: float64(cpu1-cpu0) / float64(n) / 1e3,
		redis: delta(rs0Load, rs1, n), seq: delta(rs0, seqStats, int64(b.seq))}, nil
}

// newKey returns a 36-character key (Fiber's default key check wants the
// length of a UUID), unique for (run, worker, i).
func newKey(run uint32, w, i int) string {
	return fmt.Sprintf("%08x-%04x-4000-8000-%012x", run, w, i)
}

// load sends requests over b.c connections for d and returns how many were
// answered; every answer must be 201.
func (b *bench) load(cl *http.Client, url, mode, replayKey string, d time.Duration) (int64, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, b.c)
	deadline := time.Now().Add(d)
	run := rand.Uint32()
	for w := range b.c {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				key := replayKey
				if mode != "replay" {
					key = newKey(run, w, i)
				}
				if err := send(cl, url, key, b.body); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
		return n.Load(), nil
	}
}

// send posts body with key and checks the answer.
func send(cl *http.Client, url, key string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Client-ID", "tenant-1")
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("key %s: status %d", key, resp.StatusCode)
	}
	return nil
}

// serverCPU asks the server for the CPU time it used so far (ns).
func serverCPU(cl *http.Client, base string) (int64, error) {
	resp, err := cl.Get(base + "/cpu")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
