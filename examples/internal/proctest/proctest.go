// Package proctest runs the examples' commands as separate processes in tests: it
// builds a main package, starts it, reads its first stdout line "listening on X"
// (a consumer's ready line with StartReady) and stops it at the test's cleanup.
// It also holds the vegeta targeter the process storms share. Tests only.
package proctest

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Build compiles the main package pkg (a `go build` package path, relative to the
// test's package directory, such as "." or "../../cmd/celeriant-sim") into a file
// called name in t.TempDir() and returns its path. A failed build fails the test
// with the compiler's output.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Proc is a process started by Start.
type Proc struct {
	// URL is the X of the "listening on X" line when X has a scheme, such as
	// "http://127.0.0.1:1234"; empty when it has none.
	URL string
	// Addr is the host:port of X: "127.0.0.1:1234" for both "http://127.0.0.1:1234"
	// and the celeriant-sim's "127.0.0.1:1234".
	Addr string

	t        testing.TB
	name     string
	cmd      *exec.Cmd
	drained  chan struct{} // closed when stdout reached EOF
	killed   atomic.Bool
	stopped  atomic.Bool
	waitOnce sync.Once
	waitErr  error
}

// Start runs bin with env ("KEY=value" entries) added to os.Environ() and returns
// once the process printed its first stdout line, which must be "listening on X";
// anything else, or no line, fails the test. The rest of stdout is discarded, and
// lines of stderr holding "level=WARN" or "level=ERROR" go to the test log. At
// cleanup the process gets SIGINT and must exit with status 0, unless Kill was
// called.
func Start(t testing.TB, bin string, env ...string) *Proc {
	t.Helper()
	p, line := start(t, bin, env)
	x, ok := strings.CutPrefix(line, "listening on ")
	if !ok {
		t.Fatalf("%s: unexpected first line %q", p.name, line)
	}
	p.Addr = x
	if _, hostPort, ok := strings.Cut(x, "://"); ok {
		p.URL, p.Addr = x, hostPort
	}
	return p
}

// StartReady is Start for a process that serves no address (a message
// consumer): its first stdout line must be ready, such as "consuming nats".
func StartReady(t testing.TB, bin, ready string, env ...string) *Proc {
	t.Helper()
	p, line := start(t, bin, env)
	if line != ready {
		t.Fatalf("%s: first line %q, want %q", p.name, line, ready)
	}
	return p
}

// start runs bin and returns it with its first stdout line, trimmed.
func start(t testing.TB, bin string, env []string) (*Proc, string) {
	t.Helper()
	name := filepath.Base(bin)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = w
	cmd.Stderr = &logTail{t: t, name: name}
	err = cmd.Start()
	w.Close() // the child holds its own copy
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	p := &Proc{t: t, name: name, cmd: cmd, drained: make(chan struct{})}
	t.Cleanup(func() {
		if p.stopped.Load() {
			<-p.drained
			r.Close()
			return
		}
		if !p.killed.Load() {
			_ = cmd.Process.Signal(os.Interrupt)
		}
		if err := p.wait(); err != nil && !p.killed.Load() {
			t.Errorf("%s exited with %v after SIGINT", name, err)
		}
		<-p.drained
		r.Close()
	})
	stdout := bufio.NewReader(r)
	line, err := stdout.ReadString('\n')
	go func() {
		defer close(p.drained)
		_, _ = io.Copy(io.Discard, stdout) // a full pipe would block the process
	}()
	if err != nil {
		t.Fatalf("%s printed no first line: %v", name, err)
	}
	return p, strings.TrimSpace(line)
}

// Kill stops the process with SIGKILL, in the middle of whatever it does, and
// returns once it has exited. Calls after the first do nothing. Call it from the
// test's goroutine: a failure to signal fails the test.
func (p *Proc) Kill() {
	p.t.Helper()
	if p.killed.Swap(true) {
		return
	}
	if err := p.cmd.Process.Kill(); err != nil {
		p.t.Fatalf("%s: SIGKILL: %v", p.name, err)
	}
	_ = p.wait() // "signal: killed"
}

// Stop sends SIGINT and returns once the process has exited, failing the test
// unless it exited with status 0. Calls after the first, or after Kill, do
// nothing. Call it from the test's goroutine.
func (p *Proc) Stop() {
	p.t.Helper()
	if p.killed.Load() || p.stopped.Swap(true) {
		return
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		p.t.Fatalf("%s: SIGINT: %v", p.name, err)
	}
	if err := p.wait(); err != nil {
		p.t.Fatalf("%s exited with %v after SIGINT", p.name, err)
	}
}

// Killed reports whether Kill was called.
func (p *Proc) Killed() bool { return p.killed.Load() }

// wait waits for the process to exit, once; later calls return the same error.
func (p *Proc) wait() error {
	p.waitOnce.Do(func() { p.waitErr = p.cmd.Wait() })
	return p.waitErr
}

// logTail forwards a process's warnings and errors to the test log.
type logTail struct {
	t    testing.TB
	name string
	mu   sync.Mutex
	buf  []byte
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			l.t.Logf("%s: %s", l.name, line)
		}
	}
}

// WaitFor polls cond every 20ms until it returns true, and fails the test with
// "timed out waiting for <what>" after 10 seconds. It is for state of another
// process that no channel reports.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond): // polling another process's state
		}
	}
}

// ListTargeter hands out each of targets once, in order, then returns
// vegeta.ErrNoTargets, which ends the attack. It is safe for vegeta's concurrent
// workers.
func ListTargeter(targets []vegeta.Target) vegeta.Targeter {
	var mu sync.Mutex
	i := 0
	return func(tgt *vegeta.Target) error {
		mu.Lock()
		defer mu.Unlock()
		if i == len(targets) {
			return vegeta.ErrNoTargets
		}
		*tgt = targets[i]
		i++
		return nil
	}
}
