package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

func TestRunServesTheProtocol(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	env := map[string]string{"ADDR": "127.0.0.1:0", "PAGE_BATCHES": "1"}
	done := make(chan error, 1)
	go func() { done <- run(ctx, pw, func(k string) string { return env[k] }) }()

	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok {
		t.Fatalf("first line %q", line)
	}
	c, err := celeriant.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
	for seq := uint64(1); seq <= 2; seq++ {
		_, err := c.Write(ctx, celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
			Key: key, Events: []celeriant.Event{{ClientSeq: seq, TypeMajor: 1, Value: []byte("x")}}, AllowCreate: true,
		}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	res, err := c.Read(ctx, celeriant.ReadRequest{Key: key})
	if err != nil || len(res.Batches) != 1 || res.NextVersion != 2 {
		t.Fatalf("PAGE_BATCHES=1: %+v %v", res, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRunRejectsBadEnv(t *testing.T) {
	env := map[string]string{"ADDR": "127.0.0.1:0", "SHARDS": "two"}
	if err := run(context.Background(), io.Discard, func(k string) string { return env[k] }); err == nil {
		t.Fatal("SHARDS=two accepted")
	}
}

// TestRunCluster: NODES=3 serves three nodes, one "listening on" line each, node 0
// first; with LEADER_EVERY the leader changes on schedule, and a client given every
// node writes across the elections without an error (it waits each one out).
func TestRunCluster(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	env := map[string]string{"ADDR": "127.0.0.1:0", "NODES": "3", "LEADER_EVERY": "100ms", "ELECTION": "50ms", "COMMIT_DELAY": "0"}
	done := make(chan error, 1)
	go func() { done <- run(ctx, pw, func(k string) string { return env[k] }) }()
	r := bufio.NewReader(pr)
	var addrs []string
	for range 3 {
		line, err := r.ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
		if err != nil || !ok {
			t.Fatalf("line %q, %v", line, err)
		}
		addrs = append(addrs, addr)
	}
	c, err := celeriant.New(celeriant.Config{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key, me := celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}, uuid.New()
	leaders := map[string]bool{}
	for seq := uint64(1); len(leaders) < 2; seq++ { // until a leader change was followed
		_, err := c.Write(ctx, celeriant.WriteRequest{ClientID: me, Writes: []celeriant.AggregateWrite{{
			Key: key, Events: []celeriant.Event{{ClientSeq: seq, TypeMajor: 1, Value: []byte("x")}}, AllowCreate: true,
		}}})
		if err != nil {
			t.Fatalf("write %d: %v", seq, err)
		}
		leaders[c.Leader()] = true
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
