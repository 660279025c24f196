package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// cluster is a private Postgres cluster in a temporary directory on a free port,
// for tests that stop and start the server. The shared server is never touched.
type cluster struct {
	t         testing.TB
	bin, dir  string
	data, log string
	port      int
	asRoot    bool
}

// startCluster runs initdb and pg_ctl start from $(pg_config --bindir) (as the
// postgres user when the test runs as root) and stops and removes the cluster when
// the test ends. Skips when the Postgres server binaries are missing, unless CI=true.
func startCluster(t testing.TB) *cluster {
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
	c := &cluster{t: t, bin: bin, dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "log"), asRoot: os.Geteuid() == 0}
	t.Cleanup(c.destroy)
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
	c.run("initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	c.port = freePort(t)
	c.start()
	return c
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *cluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.port)
}

func (c *cluster) command(tool string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, tool)
	if c.asRoot {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (c *cluster) run(tool string, args ...string) {
	c.t.Helper()
	if out, err := c.command(tool, args...).CombinedOutput(); err != nil {
		logTail, _ := os.ReadFile(c.log)
		c.t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", tool, strings.Join(args, " "), err, out, logTail)
	}
}

func (c *cluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40", c.port, c.dir)
	c.run("pg_ctl", "-D", c.data, "-l", c.log, "-w", "-t", "30", "-o", opts, "start")
}

// stop stops the server; mode "immediate" is a crash (no checkpoint, clients cut).
func (c *cluster) stop(mode string) {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.data, "-m", mode, "-w", "-t", "30", "stop")
}

// destroy stops the server whatever its state, kills the postmaster if pg_ctl
// could not, and removes the directory.
func (c *cluster) destroy() {
	_ = c.command("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "-t", "10", "stop").Run()
	if b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = os.RemoveAll(c.dir)
}

// TestRestartDuringClaims runs clients through the claim/execute/complete cycle
// while the private server is crashed (immediate stop) and restarted, then stopped
// cleanly and restarted. Every request ends with exactly one answer it can trust:
// a completion or a replay of the stored response. A handler runs again only after
// the Complete of an earlier run failed with a store error (its lease then expires
// and the retry takes over, as designed); a completed key is never executed again;
// and no key stays blocked past its lease.
func TestRestartDuringClaims(t *testing.T) {
	c := startCluster(t)
	ctx := t.Context()
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	const (
		workers   = 8
		lease     = 400 * time.Millisecond
		retention = time.Hour
	)
	type keyState struct {
		executions      int
		failedCompletes int
		body            []byte // the response the client got (completion or replay)
	}
	var (
		mu          sync.Mutex
		keys        = map[store.ID]*keyState{}
		storeErrors int
		stopIssuing = make(chan struct{})
		deadline    = time.Now().Add(25 * time.Second)
		wg          sync.WaitGroup
	)
	// request plays one client request for id until it gets an answer, retrying
	// after store errors (503) and in-flight answers (409, after Retry-After).
	request := func(id store.ID) error {
		st := &keyState{}
		mu.Lock()
		keys[id] = st
		mu.Unlock()
		r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("req"), Lease: lease, Retention: retention}
		for {
			if time.Now().After(deadline) {
				return fmt.Errorf("key %s still has no answer at the deadline (wedged?)", id.Key)
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			res, err := s.Claim(actx, r)
			if err == nil && res.Outcome == store.Claimed {
				mu.Lock()
				st.executions++
				body := fmt.Appendf(nil, "%s run %d", id.Key, st.executions)
				mu.Unlock()
				err = s.Complete(actx, id, res.Token, store.Response{Status: 201, Body: body}, retention)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					st.body = body
				case errors.Is(err, store.ErrLeaseLost):
					st.failedCompletes++ // our lease ran out while the server was down
				default:
					st.failedCompletes++
					storeErrors++
				}
				mu.Unlock()
				if err == nil {
					return nil
				}
				time.Sleep(20 * time.Millisecond) // the client's back-off after a 503
				continue
			}
			cancel()
			switch {
			case err != nil:
				mu.Lock()
				storeErrors++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the client's back-off after a 503
			case res.Outcome == store.Completed:
				mu.Lock()
				st.body = res.Record.Body
				mu.Unlock()
				return nil
			case res.Outcome == store.InFlight:
				time.Sleep(res.RetryAfter) // Retry-After of the 409
			default:
				return fmt.Errorf("key %s: unexpected outcome %v", id.Key, res.Outcome)
			}
		}
	}
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopIssuing:
					return
				default:
				}
				if err := request(store.ID{Scope: "restart", Key: fmt.Sprintf("w%d-%d", w, i)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}

	time.Sleep(time.Second) // let claims flow before the crash
	c.stop("immediate")
	time.Sleep(300 * time.Millisecond)
	c.start()
	time.Sleep(time.Second)
	c.stop("fast")
	time.Sleep(300 * time.Millisecond)
	c.start()
	time.Sleep(500 * time.Millisecond)
	close(stopIssuing)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Every key replays the response its client got, and ran no more often than
	// its failed completions allow.
	reexecuted := 0
	for id, st := range keys {
		if st.executions > 1+st.failedCompletes {
			t.Errorf("key %s ran %d times with %d failed completions", id.Key, st.executions, st.failedCompletes)
		}
		if st.executions > 1 {
			reexecuted++
		}
		res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("req"), Lease: lease, Retention: retention})
		switch {
		case err != nil:
			t.Errorf("final replay of %s: %v", id.Key, err)
		case res.Outcome != store.Completed:
			t.Errorf("final replay of %s: %v, want completed", id.Key, res.Outcome)
		case !bytes.Equal(res.Record.Body, st.body):
			t.Errorf("key %s replays %q but its client got %q", id.Key, res.Record.Body, st.body)
		}
	}
	t.Logf("%d requests, %d store errors seen by clients, %d keys run again after a failed completion",
		len(keys), storeErrors, reexecuted)
	if storeErrors == 0 {
		t.Error("no client saw a store error: the restarts were not observed")
	}
}
