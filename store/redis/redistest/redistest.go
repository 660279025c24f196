// Package redistest holds test helpers for code on Redis: the shared server of
// REDIS_URL, random key prefixes, and private redis-server processes (single node or
// a three-master Cluster) started on free local ports, for fault tests that must not
// touch the shared server. Everything started is stopped with t.Cleanup.
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// Shared connects to the shared server at REDIS_URL. Without it the test is
// skipped, or fails when CI=true.
func Shared(t testing.TB) *goredis.Client {
	t.Helper()
	url := testenv.Getenv(t, "REDIS_URL", "a Redis server")
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatalf("REDIS_URL: %v", err)
	}
	c := goredis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at REDIS_URL: %v", err)
	}
	return c
}

// Prefix returns a fresh random key prefix for one test and deletes the keys under
// it at cleanup (SCAN + DEL on every master; never FLUSHALL).
func Prefix(t testing.TB, c goredis.UniversalClient) string {
	t.Helper()
	prefix := "idemkey-test:" + store.NewToken().String() + ":"
	t.Cleanup(func() { deletePrefix(c, prefix) })
	return prefix
}

func deletePrefix(c goredis.UniversalClient, prefix string) {
	ctx := context.Background()
	del := func(ctx context.Context, n *goredis.Client) error {
		it := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			n.Del(ctx, it.Val())
		}
		return it.Err()
	}
	switch c := c.(type) {
	case *goredis.ClusterClient:
		_ = c.ForEachMaster(ctx, del)
	case *goredis.Client:
		_ = del(ctx, c)
	}
}

// freePort returns a TCP port that is free now, and whose cluster bus port
// (port+10000) is free too.
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if p+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return p
	}
	t.Fatal("no free port pair found")
	return 0
}

// Server is a private redis-server process.
type Server struct {
	Addr   string // 127.0.0.1:port; the same port after Restart
	dir    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	out    *syncBuffer
}

// syncBuffer collects a server's output; safe for the exec copier and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// StartServer starts a private redis-server on a free port (no persistence,
// maxmemory-policy noeviction) with extra arguments, and kills it at cleanup.
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startRedis(t, t.TempDir(), extra...)
}

// Stop kills the server (SIGKILL) and waits for it to exit. Its data is lost.
func (s *Server) Stop() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

// Pid returns the server's process id (0 when stopped), e.g. to SIGSTOP it.
func (s *Server) Pid() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Restart starts the server again on the same port after Stop.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
}

func startRedis(t testing.TB, dir string, extra ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Missing(t, "redis-server not installed")
	}
	s := &Server{dir: dir}
	t.Cleanup(s.Stop)
	// freePort's port may be taken before redis-server binds it (by another
	// test's server on this shared machine): then start again on another one.
	var err error
	for range 5 {
		port := freePort(t)
		s.Addr = "127.0.0.1:" + strconv.Itoa(port)
		s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--maxmemory-policy", "noeviction"}, extra...)
		if err = s.tryStart(); err == nil {
			return s
		}
		s.Stop()
	}
	t.Fatal(err)
	return nil
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	if err := s.tryStart(); err != nil {
		t.Fatal(err)
	}
}

// tryStart starts the process and waits until it answers on s.Addr as itself
// (INFO's process_id): a server of someone else on that port is an error, never
// a server to test against.
func (s *Server) tryStart() error {
	cmd := exec.Command("redis-server", s.args...)
	s.out = new(syncBuffer)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.exited)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	want := "process_id:" + strconv.Itoa(cmd.Process.Pid) + "\r\n"
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "server").Result()
		switch {
		case err == nil && strings.Contains(info, want):
			return nil
		case err == nil:
			return fmt.Errorf("another server answers on %s", s.Addr)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on %s exited: %v\n%s", s.Addr, err, s.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server at %s did not start: %v\n%s", s.Addr, err, s.out)
		}
	}
}

// StartCluster starts three cluster-enabled redis-server processes on free ports,
// joins them as three masters with redis-cli --cluster create, waits for
// cluster_state:ok and returns a ClusterClient. Everything is stopped at cleanup.
func StartCluster(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed")
	}
	var addrs []string
	for i := range 3 {
		dir := filepath.Join(t.TempDir(), strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		srv := startRedis(t, dir, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "5000")
		addrs = append(addrs, srv.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		n := goredis.NewClient(&goredis.Options{Addr: addr})
		for {
			info, err := n.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster at %s not ok: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = n.Close()
	}
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	for {
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return n.Ping(ctx).Err() })
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster client: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// StartSentinel starts a private redis-server and a Sentinel (redis-server
// --sentinel) monitoring it as master "idemkey", both on free ports, and returns
// a Sentinel failover client that finds the master through the Sentinel.
// Everything is stopped at cleanup.
func StartSentinel(t testing.TB) *goredis.Client {
	t.Helper()
	master := StartServer(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	dir := t.TempDir()
	port := freePort(t)
	_, mport, _ := net.SplitHostPort(master.Addr)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor idemkey 127.0.0.1 %s 1\n", port, dir, mport)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, args: []string{conf, "--sentinel"}}
	t.Cleanup(s.Stop)
	s.start(t)
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "idemkey", SentinelAddrs: []string{s.Addr}})
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("failover client through the Sentinel at %s: %v\n%s", s.Addr, err, s.out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
