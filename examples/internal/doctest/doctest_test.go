// Package doctest runs the terminal sessions of README.md and docs/*.md as printed.
//
// A ```console block preceded by `<!-- doctest: EXAMPLE [fresh] [ENV=value...] -->`
// is driven against examples/EXAMPLE: "fresh" starts a new process with ENV (which
// must be the environment of the `go run ./examples/EXAMPLE` line printed before the
// block), otherwise the block runs against the document's last process of EXAMPLE.
// Each `$ ` line (with its `\` continuations) runs in bash, with the block's and the
// earlier blocks' NAME=value lines before it and localhost:8080 replaced by the
// process's address; its output is compared with the lines printed under it: the
// status, the headers shown (Retry-After by presence only), whether
// Idempotent-Replayed is there, and the body (each JSON member shown, or the text).
//
// CELERIANT_SIM_DELAY makes a race visible to a person; here it is replaced by a
// simulator over TCP that holds the write of a backgrounded (`&`) command in flight
// until the next command has finished or waited a second, so the backgrounded call
// always wins the race.
package doctest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/internal/proctest"
	"github.com/idemkey/idemkey/internal/testenv"
)

const top = "../../.."

var (
	marker  = regexp.MustCompile("(?m)^<!-- doctest: (.+?) -->\n```console\n((?s:.*?))```\n")
	assign  = regexp.MustCompile(`^[A-Z_]+=\S+$`)
	goRunRe = regexp.MustCompile(`(?m)^(?:\$ )?((?:[A-Z_]+=\S+ )*)go run \./examples/(\S+)`)
)

// block is one annotated console block.
type block struct {
	example string
	fresh   bool
	env     []string
	text    string
	offset  int // in the document, to find the go run line printed before it
}

// command is one `$ ` line and the output printed under it.
type command struct {
	text       string
	background bool
	expect     string
}

func TestDocSessions(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.Missing(t, "curl is not installed: install curl to run the documented sessions")
	}
	docs, _ := filepath.Glob(filepath.Join(top, "docs", "*.md"))
	docs = append([]string{filepath.Join(top, "README.md")}, docs...)
	bins := map[string]string{}
	build := func(example string) string { // in t's directory: kept for every document
		if bins[example] == "" {
			bins[example] = proctest.Build(t, "../../"+example, example)
		}
		return bins[example]
	}
	found := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks := parseBlocks(t, string(b))
		if len(blocks) == 0 {
			continue
		}
		found += len(blocks)
		t.Run(filepath.Base(doc), func(t *testing.T) { runDoc(t, string(b), blocks, build) })
	}
	if found < 5 {
		t.Fatalf("found %d annotated sessions, want the README's and the walkthrough's", found)
	}
}

func parseBlocks(t *testing.T, doc string) []block {
	var out []block
	for _, m := range marker.FindAllStringSubmatchIndex(doc, -1) {
		fields := strings.Fields(doc[m[2]:m[3]])
		b := block{example: fields[0], text: doc[m[4]:m[5]], offset: m[0]}
		for _, f := range fields[1:] {
			switch {
			case f == "fresh":
				b.fresh = true
			case assign.MatchString(f):
				b.env = append(b.env, f)
			default:
				t.Fatalf("doctest marker %q: unknown word %q", doc[m[2]:m[3]], f)
			}
		}
		out = append(out, b)
	}
	return out
}

// server is a running example and, when the race is to be held, its simulator.
type server struct {
	addr string
	sim  *celeriantsim.Sim
	held *pending // the last backgrounded command
}

func runDoc(t *testing.T, doc string, blocks []block, build func(string) string) {
	servers := map[string]*server{}
	var vars []string
	for _, b := range blocks {
		if b.fresh {
			checkGoRunLine(t, doc, b)
		}
		srv := servers[b.example]
		if srv == nil || b.fresh {
			srv = startExample(t, b, build(b.example))
			servers[b.example] = srv
		}
		for _, c := range parseCommands(b.text) {
			if assign.MatchString(c.text) {
				vars = append(vars, c.text)
				continue
			}
			runCommand(t, srv, vars, c)
		}
	}
}

// checkGoRunLine: the marker's environment is the one printed on the last
// `go run ./examples/EXAMPLE` line before the block.
func checkGoRunLine(t *testing.T, doc string, b block) {
	t.Helper()
	runs := goRunRe.FindAllStringSubmatch(doc[:b.offset], -1)
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i][2] != b.example {
			continue
		}
		if got := strings.Fields(runs[i][1]); !slices.Equal(got, b.env) {
			t.Errorf("doctest %s %v: the go run line printed before it sets %v", b.example, b.env, got)
		}
		return
	}
	t.Errorf("doctest %s: no `go run ./examples/%s` printed before the block", b.example, b.example)
}

func startExample(t *testing.T, b block, bin string) *server {
	srv := &server{}
	env := []string{"ADDR=127.0.0.1:0", "IDEM_STORE=memory", "PROJECTION=memory", "CELERIANT_ADDR="}
	for _, kv := range b.env {
		if strings.HasPrefix(kv, "CELERIANT_SIM_DELAY=") {
			srv.sim = celeriantsim.New(celeriantsim.Options{})
			ln, err := srv.sim.ListenAndServe("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.sim.Close() })
			env = append(env, "CELERIANT_ADDR="+ln.Addr().String())
			continue
		}
		env = append(env, kv)
	}
	srv.addr = proctest.Start(t, bin, env...).Addr
	return srv
}

// parseCommands splits a console block into its `$ ` lines and their outputs;
// lines starting with # are comments.
func parseCommands(text string) []command {
	var out []command
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		switch {
		case strings.HasPrefix(line, "$ "):
			cmd := line[2:]
			for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
				i++
				cmd += "\n" + lines[i]
			}
			c := command{text: cmd}
			if strings.HasSuffix(cmd, " &") {
				c.text, c.background = strings.TrimSuffix(cmd, " &"), true
			}
			out = append(out, c)
		case strings.HasPrefix(line, "#"):
		case len(out) > 0:
			out[len(out)-1].expect += line + "\n"
		}
	}
	return out
}

// pending is a backgrounded command whose simulator write is held.
type pending struct {
	hold *celeriantsim.Hold
	done chan error
}

func runCommand(t *testing.T, srv *server, vars []string, c command) {
	t.Helper()
	script := strings.Join(vars, "\n") + "\n" + strings.ReplaceAll(c.text, "localhost:8080", srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if c.background {
		background(t, srv, cmd)
		return
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if strings.HasPrefix(c.text, "sleep ") {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := waitReleasing(srv, done); err != nil {
		t.Fatalf("%s: %v\n%s", c.text, err, stderr.String())
	}
	compare(t, c, stdout.String())
}

// background starts cmd; with a simulator, it holds the write cmd makes and
// returns once that write is in flight.
func background(t *testing.T, srv *server, cmd *exec.Cmd) {
	t.Helper()
	p := &pending{done: make(chan error, 1)}
	if srv.sim != nil {
		p.hold = srv.sim.HoldNextWrite()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	if p.hold != nil {
		select {
		case <-p.hold.Prepared():
		case <-time.After(20 * time.Second):
			t.Fatal("the backgrounded command's write never reached the simulator")
		}
	}
	srv.held = p
	t.Cleanup(func() {
		if p.hold != nil {
			p.hold.Commit()
		}
		<-p.done
	})
}

// waitReleasing waits for done. A held write of an earlier backgrounded command is
// committed when the command finished or after a second of waiting (a retry that
// waits for the first call blocks until then). A `sleep` leaves it held.
func waitReleasing(srv *server, done chan error) error {
	p := srv.held
	if p == nil || p.hold == nil {
		return <-done
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Second):
		p.hold.Commit()
		err = <-done
	}
	p.hold.Commit()
	return err
}

// response is curl's output split into status, headers and body.
type response struct {
	status  string
	headers map[string]string
	body    string
}

func parseResponse(out string) response {
	out = strings.ReplaceAll(out, "\r\n", "\n")
	r := response{headers: map[string]string{}}
	if !strings.HasPrefix(out, "HTTP/") {
		r.body = strings.TrimSpace(out)
		return r
	}
	head, body, _ := strings.Cut(out, "\n\n")
	lines := strings.Split(head, "\n")
	if f := strings.Fields(lines[0]); len(f) > 1 {
		r.status = f[1]
	}
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok {
			r.headers[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	r.body = strings.TrimSpace(body)
	return r
}

func compare(t *testing.T, c command, out string) {
	t.Helper()
	want, got := parseResponse(c.expect), parseResponse(out)
	first := strings.SplitN(c.text, "\n", 2)[0]
	if want.status != got.status {
		t.Errorf("%s: status %q, the text shows %q", first, got.status, want.status)
	}
	for k, v := range want.headers {
		if g, ok := got.headers[k]; !ok || (k != "retry-after" && g != v) {
			t.Errorf("%s: header %s = %q (present %v), the text shows %q", first, k, g, ok, v)
		}
	}
	if _, ok := got.headers["idempotent-replayed"]; ok && want.status != "" && want.headers["idempotent-replayed"] == "" {
		t.Errorf("%s: the answer is marked as a replay, the text shows none", first)
	}
	compareBody(t, first, want.body, got.body)
}

func compareBody(t *testing.T, first, want, got string) {
	t.Helper()
	var w, g map[string]any
	if json.Unmarshal([]byte(want), &w) != nil {
		if want != got {
			t.Errorf("%s: body %q, the text shows %q", first, got, want)
		}
		return
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Errorf("%s: body %q is not JSON: %v", first, got, err)
		return
	}
	for k, v := range w {
		if !reflect.DeepEqual(g[k], v) {
			t.Errorf("%s: member %q = %v, the text shows %v", first, k, g[k], v)
		}
	}
}
