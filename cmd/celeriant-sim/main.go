// Command celeriant-sim serves the Celeriant simulator (package celeriantsim) over TCP
// with the real wire protocol, so clients in several processes share one in-memory log.
//
// Environment: ADDR is the listen address (default 127.0.0.1:10000); SHARDS the shard
// count for multi-aggregate routing (default 1); PAGE_BATCHES caps the batches of a read
// page (default 0, no cap). It prints "listening on ADDR" once ready and stops on
// SIGINT/SIGTERM. The log is in memory only.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

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
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sim := celeriantsim.New(celeriantsim.Options{Shards: shards, PageBatches: page, Logger: log})
	ln, err := sim.ListenAndServe(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	<-ctx.Done()
	return sim.Close()
}
