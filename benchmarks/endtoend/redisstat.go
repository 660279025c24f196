package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// startRedis starts a private redis-server on a free loopback port (no
// persistence) and returns its address and a stop function.
func startRedis() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "endtoend-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--maxmemory-policy", "noeviction")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	for range 100 {
		if c.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("redis-server on %s did not start", addr)
}

// redisStats is a snapshot of the server's counters: its main thread's CPU time
// (INFO cpu, user and system) and, per command, calls and microseconds (INFO
// commandstats).
type redisStats struct {
	mainCPU time.Duration
	calls   map[string]int64
	usec    map[string]int64
}

// add adds what Redis spent between before and after to st.
func (st *redisStats) add(before, after redisStats) {
	if st.calls == nil {
		st.calls, st.usec = map[string]int64{}, map[string]int64{}
	}
	st.mainCPU += after.mainCPU - before.mainCPU
	for name, c := range after.calls {
		st.calls[name] += c - before.calls[name]
		st.usec[name] += after.usec[name] - before.usec[name]
	}
}

// readStats reads INFO cpu and INFO commandstats.
func readStats(c *goredis.Client) (redisStats, error) {
	ctx := context.Background()
	st := redisStats{calls: map[string]int64{}, usec: map[string]int64{}}
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread":
			f, _ := strconv.ParseFloat(v, 64)
			st.mainCPU += time.Duration(f * 1e9)
		case strings.HasPrefix(k, "cmdstat_"):
			name := strings.TrimPrefix(k, "cmdstat_")
			for _, kv := range strings.Split(v, ",") {
				f, val, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(val, 10, 64)
				switch f {
				case "calls":
					st.calls[name] = n
				case "usec":
					st.usec[name] = n
				}
			}
		}
	}
	return st, nil
}

// redisDelta is what Redis spent between two snapshots, per request.
type redisDelta struct {
	cpuPerReq float64            // main-thread CPU, µs per request
	perReq    map[string]float64 // calls per request, per command
	usecCall  map[string]float64 // usec_per_call over the window, per command
}

func delta(before, after redisStats, n int64) redisDelta {
	d := redisDelta{cpuPerReq: float64(after.mainCPU-before.mainCPU) / float64(n) / 1e3,
		perReq: map[string]float64{}, usecCall: map[string]float64{}}
	for name, calls := range after.calls {
		if name == "info" || name == "config|resetstat" || name == "ping" {
			continue
		}
		dc := calls - before.calls[name]
		if dc <= 0 {
			continue
		}
		d.perReq[name] = float64(dc) / float64(n)
		d.usecCall[name] = float64(after.usec[name]-before.usec[name]) / float64(dc)
	}
	return d
}

// commands formats the per-command figures: "set 1.00x 1.9us, evalsha 1.00x 6.1us".
func (d redisDelta) commands() string {
	names := make([]string, 0, len(d.perReq))
	for n := range d.perReq {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2fx %.1fus", n, d.perReq[n], d.usecCall[n]))
	}
	return strings.Join(parts, ", ")
}

// emptyScript is a Lua script that does nothing: its EVALSHA is Lua's fixed
// cost per call, beside a plain command's.
var emptyScript = goredis.NewScript("return 1")

// plainOps measures plain GETs and SETs of value on c connections, n of each,
// and as many EVALSHAs of emptyScript, in this process: Redis's main-thread CPU
// per command and usec_per_call, the floor a request's commands are compared
// with.
func plainOps(addr string, value string, c, n int) (get, set, eval redisDelta, err error) {
	cl := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: c})
	defer cl.Close()
	ctx := context.Background()
	key := "endtoend-plain:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := cl.Set(ctx, key, value, time.Hour).Err(); err != nil {
		return get, set, eval, err
	}
	if err := emptyScript.Run(ctx, cl, []string{key}).Err(); err != nil { // loaded before it counts
		return get, set, eval, err
	}
	run := func(op func() error) (redisDelta, error) {
		before, err := readStats(cl)
		if err != nil {
			return redisDelta{}, err
		}
		var wg sync.WaitGroup
		errs := make(chan error, c)
		per := n / c
		for range c {
			wg.Go(func() {
				for range per {
					if err := op(); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return redisDelta{}, err
		}
		after, err := readStats(cl)
		return delta(before, after, int64(per*c)), err
	}
	if get, err = run(func() error { return cl.Get(ctx, key).Err() }); err != nil {
		return get, set, eval, err
	}
	if set, err = run(func() error { return cl.Set(ctx, key, value, time.Hour).Err() }); err != nil {
		return get, set, eval, err
	}
	eval, err = run(func() error { return emptyScript.EvalSha(ctx, cl, []string{key}).Err() })
	return get, set, eval, err
}
