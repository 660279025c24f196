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
package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
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
	sim := celeriantsim.New(opts)
	ln, err := sim.ListenAndServe(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	<-ctx.Done()
	return sim.Close()
}
