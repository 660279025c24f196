// Command loopback measures the middleware end to end over HTTP on loopback, on
// the memory store, against the bare handler (read a JSON body, answer 201 with
// a small JSON document, as benchmarks/peers):
//
//	go run ./loopback -rounds 5 -d 2s -c 4 -body 1024
//
// Each round serves three modes in turn, each in a fresh server process (this
// program started again with -serve): bare (the handler alone), first (the
// middleware, a new key every request) and replay (the middleware, one key
// completed before the run, every request a replay). A client in this process
// sends requests over -c keep-alive connections for -d, after a warm-up of a
// tenth of it, and counts the answers. Per mode it prints requests/s and the
// server process's CPU time per request (user and system, from its resource
// usage when it exits), and per round the ratio of first and replay to bare;
// then the medians over the rounds.
//
// On a machine with few cores the client's own work competes with the server's,
// so requests/s understates what the server could do alone and compresses the
// ratios towards 1; server CPU per request (cpu-us/req) is the figure that does
// not depend on the client or on other load. Rounds interleave the modes so that
// a change of load affects them alike: compare ratios within a run.
//
// -cpuprofile PATH writes each server's CPU profile (warm-up included) to
// PATH.bare, PATH.first and PATH.replay, the last round's; read them with go tool
// pprof against a binary built with go build -o lb ./loopback.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/benchmarks/internal/httpload"
	"github.com/idemkey/idemkey/internal/cputime"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store/memory"
)

var modes = []string{"bare", "first", "replay"}

// profile is -cpuprofile: the servers' CPU profile path (without the mode).
var profile string

func main() {
	serveMode := flag.String("serve", "", "internal: serve this mode on 127.0.0.1 until stdin closes")
	rounds := flag.Int("rounds", 5, "rounds of the three modes")
	d := flag.Duration("d", 2*time.Second, "measured time of each mode in a round")
	c := flag.Int("c", 4, "client connections (and concurrent requests)")
	bodySize := flag.Int("body", 1024, "request body size in bytes (at least 80)")
	flag.StringVar(&profile, "cpuprofile", "", "write each server's CPU profile to this path followed by .MODE (the last round's)")
	flag.Parse()
	if *serveMode != "" {
		serve(*serveMode)
		return
	}
	if *rounds < 1 || *c < 1 || *d <= 0 {
		log.Fatal("-rounds, -c and -d must be positive")
	}
	body := httpload.JSONBody(max(*bodySize, 80))
	fmt.Printf("loopback: %d rounds of %v per mode, %d connections, %d-byte body\n", *rounds, *d, *c, len(body))
	fmt.Println("round mode      req/s   cpu-us/req  x bare (req/s)  x bare (cpu)")
	res := map[string][]result{}
	ratios := map[string][]float64{}
	cpuRatios := map[string][]float64{}
	for r := range *rounds {
		var bare result
		for _, mode := range modes {
			got, err := runMode(mode, body, *c, *d)
			if err != nil {
				log.Fatalf("round %d, %s: %v", r+1, mode, err)
			}
			res[mode] = append(res[mode], got)
			line := fmt.Sprintf("%5d %-7s %8.0f %10.1f", r+1, mode, got.rps, got.cpuPerReq)
			if mode == "bare" {
				bare = got
			} else {
				x, xc := got.rps/bare.rps, bare.cpuPerReq/got.cpuPerReq
				ratios[mode] = append(ratios[mode], x)
				cpuRatios[mode] = append(cpuRatios[mode], xc)
				line += fmt.Sprintf("  %12.2f  %12.2f", x, xc)
			}
			fmt.Println(line)
		}
	}
	fmt.Println("\nmedians over rounds   req/s  cpu-us/req  x bare (req/s)  x bare (cpu)")
	for _, mode := range modes {
		rps := httpload.Median(mapSlice(res[mode], func(x result) float64 { return x.rps }))
		cpu := httpload.Median(mapSlice(res[mode], func(x result) float64 { return x.cpuPerReq }))
		line := fmt.Sprintf("%-20s %8.0f %10.1f", mode, rps, cpu)
		if mode != "bare" {
			line += fmt.Sprintf("  %12.2f  %12.2f", httpload.Median(ratios[mode]), httpload.Median(cpuRatios[mode]))
		}
		fmt.Println(line)
	}
	fmt.Println("(x bare (cpu) is bare's server CPU per request over the mode's: 1 is as cheap as bare)")
}

// result is one mode's run: requests/s seen by the client and the server's
// CPU time per request in microseconds.
type result struct {
	rps, cpuPerReq float64
}

// runMode starts a server process for mode, warms it up, sends requests for d
// over c connections, stops the server and returns what it measured.
func runMode(mode string, body []byte, c int, d time.Duration) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	args := []string{"-serve", mode}
	if profile != "" {
		args = append(args, "-cpuprofile", profile+"."+mode)
	}
	cmd := exec.Command(self, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return result{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer cmd.Process.Kill() // after Wait: a no-op
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening on http://") {
		return result{}, fmt.Errorf("server did not start: %q", lines.Text())
	}
	url := strings.TrimPrefix(lines.Text(), "listening on ") + "/api/transfers"
	tr := &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	if mode == "replay" { // the one key every request replays
		if err := httpload.Send(cl, url, "replayed-key", body); err != nil {
			return result{}, err
		}
	}
	if _, err := load(cl, url, mode, body, c, d/10, "w"); err != nil {
		return result{}, err
	}
	// The server's CPU is read at its exit: measure the warm-up's apart by
	// asking the server for its usage so far.
	before, err := httpload.ServerCPU(cl, strings.TrimSuffix(url, "/api/transfers"))
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	n, err := load(cl, url, mode, body, c, d, "m")
	if err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	after, err := httpload.ServerCPU(cl, strings.TrimSuffix(url, "/api/transfers"))
	if err != nil {
		return result{}, err
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		return result{}, err
	}
	return result{rps: float64(n) / elapsed.Seconds(), cpuPerReq: float64(after-before) / float64(n) / 1e3}, nil
}

// load sends requests over c connections for d and returns how many were
// answered; every answer must be 201 (a first execution must have run, a
// replay must carry Idempotency-Replayed).
func load(cl *http.Client, url, mode string, body []byte, c int, d time.Duration, tag string) (int64, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	deadline := time.Now().Add(d)
	for w := range c {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				key := "replayed-key"
				if mode != "replay" {
					key = tag + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				}
				if err := httpload.Send(cl, url, key, body); err != nil {
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

// serve runs the server of mode on a free loopback port, prints its address,
// and exits when stdin closes. GET /cpu answers the process's CPU time (ns).
func serve(mode string) {
	answer := []byte(`{"balanceCents":98766,"aggregateVersion":42}`)
	var handler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
	})
	if mode != "bare" {
		// first keeps every key of a run: a bound far above it.
		m, err := middleware.New(memory.New(memory.WithMaxBytes(1<<40)), middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
			middleware.WithRecordRetention(policy.RetentionRule{Default: 24 * time.Hour}), middleware.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			log.Fatal(err)
		}
		handler = m.Handler(handler)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api/transfers", handler)
	mux.HandleFunc("GET /cpu", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, int64(cputime.Used()))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if profile != "" { // the serve process's own -cpuprofile: the path itself
		f, err := os.Create(profile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func mapSlice[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
