// Package pgtest starts private Postgres clusters for the tests of store/postgres
// and of the modules that run it (the examples): a cluster of its own in a
// temporary directory on a free port, from the server binaries of
// $(pg_config --bindir), for fault tests that stop, hang, crash or fail over a
// server; the shared server of DATABASE_URL is never touched. Everything started
// is stopped and removed with t.Cleanup.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkey/idemkey/internal/testenv"
)

// Cluster is a private Postgres cluster: Data is its data directory, inside Dir,
// and Port the port its server listens on at 127.0.0.1.
type Cluster struct {
	t         testing.TB
	bin       string
	Dir, Data string
	log       string
	Port      int
	asRoot    bool // the tools run as the postgres user (Postgres refuses to run as root)
}

// Start runs initdb and pg_ctl start (as the postgres user when the test runs as
// root), and stops and removes the cluster when the test ends. Without the
// Postgres server binaries the test is skipped, or fails when CI=true; with
// -short it is skipped.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the private Postgres cluster")
	}
	out, err := exec.Command("pg_config", "--bindir").Output()
	bin := strings.TrimSpace(string(out))
	if err == nil {
		_, err = os.Stat(filepath.Join(bin, "initdb"))
	}
	if err != nil {
		testenv.Missing(t, "Postgres server binaries (pg_config --bindir, initdb) not found (%v): the private cluster test needs them", err)
	}
	dir, err := os.MkdirTemp("", "idemkey-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bin: bin, Dir: dir, Data: filepath.Join(dir, "data"), log: filepath.Join(dir, "log"), asRoot: os.Geteuid() == 0}
	t.Cleanup(func() {
		c.destroy()
		_ = os.RemoveAll(dir)
	})
	if c.asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.Run("initdb", "-D", c.Data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	c.Port = freePort(t)
	c.Start()
	return c
}

// Standby takes a base backup of c (pg_basebackup -R: streaming replication
// configured) into c's directory and starts it as a standby on a free port,
// stopped when the test ends (before c's directory is removed).
func (c *Cluster) Standby(t testing.TB) *Cluster {
	t.Helper()
	sb := &Cluster{t: t, bin: c.bin, Dir: c.Dir, Data: filepath.Join(c.Dir, "standby"),
		log: filepath.Join(c.Dir, "standby.log"), asRoot: c.asRoot}
	c.Run("pg_basebackup", "-D", sb.Data, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-R", "-X", "stream", "-c", "fast", "--no-sync")
	sb.Port = freePort(t)
	t.Cleanup(sb.destroy)
	sb.Start()
	return sb
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// URL is the cluster's URL for the postgres superuser, database postgres, with
// sslmode=disable; a caller adds its own parameters after "&".
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Command is the command running tool of the server binaries with args, as the
// postgres user when the test runs as root.
func (c *Cluster) Command(tool string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, tool)
	if c.asRoot {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// Run runs tool as Command does and fails the test, with the tool's output and
// the server's log, when it fails.
func (c *Cluster) Run(tool string, args ...string) {
	c.t.Helper()
	if out, err := c.Command(tool, args...).CombinedOutput(); err != nil {
		logTail, _ := os.ReadFile(c.log)
		c.t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", tool, strings.Join(args, " "), err, out, logTail)
	}
}

// Start starts the server (again, after Stop) on the cluster's port and waits
// until it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40", c.Port, c.Dir)
	c.Run("pg_ctl", "-D", c.Data, "-l", c.log, "-w", "-t", "120", "-o", opts, "start")
}

// Stop stops the server; mode "immediate" is a crash (no checkpoint, clients
// cut), "fast" a clean shutdown.
func (c *Cluster) Stop(mode string) {
	c.t.Helper()
	c.Run("pg_ctl", "-D", c.Data, "-m", mode, "-w", "-t", "30", "stop")
}

// Signal sends sig to the postmaster and every process it started (backends,
// checkpointer, WAL writer...), the postmaster first: SIGSTOP hangs the server,
// SIGCONT resumes it, SIGKILL is a machine losing power. It fails the test when
// the server is not running.
func (c *Cluster) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	pids := c.processes()
	if len(pids) == 0 {
		t.Fatalf("no postmaster.pid in %s", c.Data)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Logf("signal %v to %d: %v", sig, pid, err)
		}
	}
}

// processes returns the cluster's postmaster, from postmaster.pid, and the
// processes whose parent it is, from /proc; none when there is no postmaster.pid.
func (c *Cluster) processes() []int {
	b, err := os.ReadFile(filepath.Join(c.Data, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pm, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil || pm <= 0 {
		return nil
	}
	pids := []int{pm}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		st, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pm) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// destroy stops the server whatever its state: resumed first (a test may have
// left it stopped with SIGSTOP), then pg_ctl stop, then SIGKILL for what pg_ctl
// could not stop.
func (c *Cluster) destroy() {
	pids := c.processes()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	_ = c.Command("pg_ctl", "-D", c.Data, "-m", "immediate", "-w", "-t", "30", "stop").Run()
	for _, pid := range c.processes() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
