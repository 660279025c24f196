package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/benchmarks/internal/httpload"
	"github.com/idemkey/idemkey/store"
)

type bench struct {
	cfg  serveConfig
	rc   *goredis.Client
	body []byte
	c    int
	d    time.Duration
	seq  int // requests of the sequential phase
	// floorKey holds the record idemkey's Redis store keeps for the run's
	// answer: the value the floor endpoints read and write.
	floorKey string
	profDir  string // where servers write their profiles ("": none)
	roundNo  int    // the round running, for profile names
}

// runResult is one (subject, mode) run.
type runResult struct {
	rps, cpuPerReq float64    // requests/s seen by the client; server CPU, µs per request
	redis          redisDelta // Redis under the concurrent load
	seq            redisDelta // Redis per request, one request at a time
	floor          redisDelta // the same for the floor (GET or GET+SET), interleaved with seq
}

// roundResult is one round: every run, and the plain GET and SET floor (one
// command at a time, as the sequential phase of the runs).
type roundResult struct {
	runs           map[string]runResult // by "subject/mode"
	get, set, eval redisDelta           // eval: an empty script's EVALSHA
}

// round runs every subject once (bare) or in both modes, then plain commands
// on the floor's value in a loop.
func (b *bench) round(n int, subs []string) roundResult {
	res := roundResult{runs: map[string]runResult{}}
	b.roundNo = n
	fmt.Printf("\nround %d\n%-27s %9s %11s %9s %9s %9s  %s\n", n, "run", "req/s", "cpu-us/req", "redis-us", "seq-us", "floor-us",
		"redis commands per request, one at a time (usec_per_call)")
	for _, s := range subs {
		modes := []string{"first", "replay"}
		if strings.HasSuffix(s, "bare") {
			modes = []string{"bare"}
		}
		for _, mode := range modes {
			r, err := b.run(s, mode, "endtoend:"+store.NewToken().String()[:8]+":")
			if err != nil {
				fmt.Fprintf(os.Stderr, "round %d, %s/%s: %v\n", n, s, mode, err)
				os.Exit(1)
			}
			res.runs[s+"/"+mode] = r
			fmt.Printf("%-27s %9.0f %11.1f %9.2f %9.2f %9.2f  %s\n", s+"/"+mode, r.rps, r.cpuPerReq, r.redis.cpuPerReq,
				r.seq.cpuPerReq, r.floor.cpuPerReq, r.seq.commands())
		}
	}
	record, _ := b.rc.Get(context.Background(), b.floorKey).Result()
	get, set, eval, err := plainOps(b.cfg.redisAddr, record, 1, b.seq)
	if err != nil {
		fmt.Fprintf(os.Stderr, "plain commands: %v\n", err)
		os.Exit(1)
	}
	res.eval = eval
	fmt.Printf("%-20s %9s %11s %9s %9.2f %9s  %s\n", "empty EVALSHA loop", "", "", "", eval.cpuPerReq, "", eval.commands())
	res.get, res.set = get, set
	fmt.Printf("%-27s %9s %11s %9s %9.2f %9s  %s (value of %d bytes)\n", "plain GET loop", "", "", "", get.cpuPerReq, "", get.commands(), len(record))
	fmt.Printf("%-27s %9s %11s %9s %9.2f %9s  %s\n", "plain SET loop", "", "", "", set.cpuPerReq, "", set.commands())
	return res
}

// setFloor stores, under a key of its own, the value idemkey's Redis store
// keeps for the run's answer: one request through a Redis subject, then its
// record (the fields' values joined, for a record kept as a hash).
func (b *bench) setFloor() error {
	prefix := "endtoend:" + store.NewToken().String()[:8] + ":"
	srv, err := b.start("redis", prefix, "")
	if err != nil {
		return err
	}
	err = httpload.Send(srv.cl, srv.url, newKey(rand.Uint32(), 0, 0), b.body)
	srv.stop()
	if err != nil {
		return err
	}
	v := storedRecord(b.rc, prefix)
	if v == "" {
		return fmt.Errorf("no record under %s", prefix)
	}
	b.floorKey = prefix + "floor"
	b.cfg.floorKey = b.floorKey
	return b.rc.Set(context.Background(), b.floorKey, v, 24*time.Hour).Err()
}

// storedRecord returns the value the Redis subject keeps for its replayed key.
func storedRecord(c *goredis.Client, prefix string) string {
	ctx := context.Background()
	keys, _ := c.Keys(ctx, prefix+"*").Result()
	for _, k := range keys {
		if v, err := c.Get(ctx, k).Result(); err == nil {
			return v
		}
		if h, err := c.HGetAll(ctx, k).Result(); err == nil && len(h) > 0 {
			var sb strings.Builder
			for f, v := range h {
				sb.WriteString(f + v)
			}
			return sb.String()
		}
	}
	return ""
}

// server is a running server process of one subject.
type server struct {
	cl        *http.Client
	base, url string
	stop      func()
}

// start starts a server process for subject and waits until it listens; it
// writes profiles named profile in b.profDir when both are set.
func (b *bench) start(subject, prefix, profile string) (*server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-serve", subject, "-redis", b.cfg.redisAddr, "-pg", b.cfg.pgURL,
		"-schema", b.cfg.schema, "-prefix", prefix, "-floor", b.cfg.floorKey)
	if b.profDir != "" && profile != "" {
		cmd.Args = append(cmd.Args, "-cpuprofile", filepath.Join(b.profDir, profile))
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: b.c, MaxConnsPerHost: b.c, DisableCompression: true}
	stop := func() {
		tr.CloseIdleConnections()
		stdin.Close()
		_ = cmd.Wait()
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening on http://") {
		_ = cmd.Process.Kill()
		stop()
		return nil, fmt.Errorf("server did not start: %q", lines.Text())
	}
	base := strings.TrimPrefix(lines.Text(), "listening on ")
	return &server{cl: &http.Client{Transport: tr}, base: base, url: base + "/api/transfers", stop: stop}, nil
}

// run starts a server process for subject, warms it up, sends requests for
// b.d, then b.seq one at a time, alternating batches with the floor's, stops
// the server and returns what it and Redis measured.
func (b *bench) run(subject, mode, prefix string) (runResult, error) {
	srv, err := b.start(subject, prefix, fmt.Sprintf("%s-%s-%d", subject, mode, b.roundNo))
	if err != nil {
		return runResult{}, err
	}
	defer srv.stop()
	cl, url := srv.cl, srv.url
	replayKey := newKey(rand.Uint32(), 0, 0)
	if mode == "replay" {
		if err := httpload.Send(cl, url, replayKey, b.body); err != nil {
			return runResult{}, err
		}
	}
	if _, err := b.load(cl, url, mode, replayKey, b.d/10); err != nil {
		return runResult{}, err
	}
	cpu0, err := httpload.ServerCPU(cl, srv.base)
	if err != nil {
		return runResult{}, err
	}
	rs0, err := readStats(b.rc)
	if err != nil {
		return runResult{}, err
	}
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
	cpu1, err := httpload.ServerCPU(cl, srv.base)
	if err != nil {
		return runResult{}, err
	}
	res := runResult{rps: float64(n) / elapsed.Seconds(), cpuPerReq: float64(cpu1-cpu0) / float64(n) / 1e3,
		redis: delta(rs0, rs1, n)}
	if mode == "bare" {
		return res, nil // no Redis to measure
	}
	floorURL := srv.base + "/floor/get"
	if mode != "replay" {
		floorURL = srv.base + "/floor/getset"
	}
	res.seq, res.floor, err = b.sequential(cl, url, floorURL, mode, replayKey)
	return res, err
}

// sequential sends b.seq requests to url one at a time, in batches alternating
// with as many to floorURL, and returns Redis's cost per request of each.
func (b *bench) sequential(cl *http.Client, url, floorURL, mode, replayKey string) (subject, floor redisDelta, err error) {
	const batch = 100
	var acc [2]redisStats
	run := rand.Uint32()
	done := 0
	for done < b.seq {
		k := min(batch, b.seq-done)
		for side, u := range []string{url, floorURL} {
			before, err := readStats(b.rc)
			if err != nil {
				return subject, floor, err
			}
			for i := range k {
				key := replayKey
				if mode != "replay" || side == 1 {
					key = newKey(run, side+1, done+i)
				}
				if err := httpload.Send(cl, u, key, b.body); err != nil {
					return subject, floor, err
				}
			}
			after, err := readStats(b.rc)
			if err != nil {
				return subject, floor, err
			}
			acc[side].add(before, after)
		}
		done += k
	}
	n := int64(b.seq)
	return delta(redisStats{}, acc[0], n), delta(redisStats{}, acc[1], n), nil
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
				if err := httpload.Send(cl, url, key, b.body); err != nil {
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
