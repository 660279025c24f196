// Command celeriant-sim serves the Celeriant simulator (package celeriantsim) over TCP
// with the real wire protocol, so clients in several processes share one in-memory log.
//
// Environment: ADDR is the listen address (default 127.0.0.1:10000); SHARDS the shard
// count for multi-aggregate routing (default 1); PAGE_BATCHES caps the batches of a read
// page (default 0, no cap); COMMIT_DELAY how long each write stays in flight before it
// commits (a Go duration, default celeriantsim.DefaultCommitDelay; 0 commits at once);
// TIMESTAMP_PRECISION the unit of the batch server timestamps (ms, us or ns, default
// ms); API_KEY a read-write API key (standard base64 of 32 bytes) that an Identify must
// present, and REQUIRE_IDENTITY=true the server's --require-client-identity. It prints
// "listening on ADDR" once ready and stops on SIGINT/SIGTERM. The log is in memory only.
//
// Cluster mode: NODES=n (default 1) serves n nodes over one log, node 0 on ADDR and
// node i on ADDR's port plus i (port 0: free ports), node 0 leading; it prints one
// "listening on ADDR" line per node, node 0's first. LEADER_EVERY (a Go duration,
// default 0: never) holds an election that often: no node leads for ELECTION (default
// 300ms; every write is answered 2011 with "{}"), then the next node leads. Give a
// client every node: CELERIANT_ADDR=host:p0,host:p1,... in the examples.
package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "celeriant-sim:", err)
		os.Exit(1)
	}
}

func envInt(getenv func(string) string, name string) (int, error) {
	v := getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want a non-negative integer", name, v)
	}
	return n, nil
}

// serverEnv reads COMMIT_DELAY, TIMESTAMP_PRECISION, API_KEY and REQUIRE_IDENTITY.
func serverEnv(getenv func(string) string, opts *celeriantsim.Options) error {
	if v := getenv("COMMIT_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("COMMIT_DELAY=%q: want a non-negative Go duration", v)
		}
		opts.CommitDelay = d
		if d == 0 {
			opts.CommitDelay = celeriantsim.NoCommitDelay
		}
	}
	p, err := celeriant.ParsePrecision(getenv("TIMESTAMP_PRECISION"))
	if err != nil {
		return err
	}
	opts.Precision = p
	if k := getenv("API_KEY"); k != "" {
		if b, err := base64.StdEncoding.DecodeString(k); err != nil || len(b) != celeriant.APIKeySize {
			return fmt.Errorf("API_KEY: want standard base64 of %d bytes", celeriant.APIKeySize)
		}
		opts.APIKeys = map[string]celeriant.AccessLevel{k: celeriant.ReadWrite}
	}
	switch v := getenv("REQUIRE_IDENTITY"); v {
	case "", "false":
	case "true":
		opts.RequireIdentity = true
	default:
		return fmt.Errorf("REQUIRE_IDENTITY=%q: want true or false", v)
	}
	return nil
}

// run serves until ctx is done, printing "listening on ADDR" to stdout once ready.
func run(ctx context.Context, stdout io.Writer, getenv func(string) string) error {
	addr := getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:10000"
	}
	shards, err := envInt(getenv, "SHARDS")
	if err != nil {
		return err
	}
	page, err := envInt(getenv, "PAGE_BATCHES")
	if err != nil {
		return err
	}
	opts := celeriantsim.Options{Shards: shards, PageBatches: page}
	if err := serverEnv(getenv, &opts); err != nil {
		return err
	}
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	nodes, err := envInt(getenv, "NODES")
	if err != nil {
		return err
	}
	if nodes > 1 {
		return runCluster(ctx, stdout, getenv, addr, nodes, opts)
	}
	sim := celeriantsim.New(opts)
	ln, err := sim.ListenAndServe(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	<-ctx.Done()
	return sim.Close()
}

// runCluster serves NODES nodes from addr's port on (see the package doc), holding
// elections every LEADER_EVERY for ELECTION, until ctx is done.
func runCluster(ctx context.Context, stdout io.Writer, getenv func(string) string, addr string, nodes int, opts celeriantsim.Options) error {
	every, err := envDuration(getenv, "LEADER_EVERY", 0)
	if err != nil {
		return err
	}
	election, err := envDuration(getenv, "ELECTION", 300*time.Millisecond)
	if err != nil {
		return err
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("ADDR=%q: %w", addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port+nodes > 65536 {
		return fmt.Errorf("ADDR=%q: want a port that leaves room for %d nodes", addr, nodes)
	}
	addrs := make([]string, nodes)
	for i := range addrs {
		p := 0
		if port > 0 {
			p = port + i
		}
		addrs[i] = net.JoinHostPort(host, strconv.Itoa(p))
	}
	cl, err := celeriantsim.ListenCluster(addrs, opts)
	if err != nil {
		return err
	}
	for _, a := range cl.Addrs() {
		fmt.Fprintf(stdout, "listening on %s\n", a)
	}
	if every > 0 {
		go cl.Elections(ctx, every, election)
	}
	<-ctx.Done()
	return cl.Close()
}

// envDuration reads a non-negative Go duration, def when unset.
func envDuration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s=%q: want a non-negative Go duration", name, v)
	}
	return d, nil
}
