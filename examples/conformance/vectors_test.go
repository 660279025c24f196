package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
	"github.com/idemkey/idemkey/internal/testenv"
)

// The vector format of docs/conformance.md.
type vector struct {
	ID       string   `json:"id"`
	Tier     string   `json:"tier"`
	Title    string   `json:"title"`
	Requires []string `json:"requires"`
	Steps    []step   `json:"steps"`
}

type step struct {
	ID             string   `json:"id"`
	DelayMs        int      `json:"delayMs"`
	ConcurrentWith []string `json:"concurrentWith"`
	Request        struct {
		Method  string            `json:"method"`
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
		Body    *string           `json:"body"`
	} `json:"request"`
	Expect struct {
		Status             int                        `json:"status"`
		Headers            map[string]json.RawMessage `json:"headers"`
		BodyEquals         json.RawMessage            `json:"bodyEquals"`
		BodyJSON           map[string]json.RawMessage `json:"bodyJson"`
		BodyBytes          *int                       `json:"bodyBytes"`
		HandlerInvocations *int                       `json:"handlerInvocations"`
	} `json:"expect"`
}

type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func loadVectors(t *testing.T, dir string) []vector {
	t.Helper()
	var out []vector
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".json" {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var v vector
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no vectors under %s", dir)
	}
	return out
}

// TestVectors runs every vector under IDEM_CONFORMANCE_DIR against the fixture
// served over TCP: the core tier with the defaults, every tier with the replay
// header the profile expects, for each store the environment makes available.
func TestVectors(t *testing.T) {
	dir := os.Getenv("IDEM_CONFORMANCE_DIR")
	if dir == "" {
		t.Skip("IDEM_CONFORMANCE_DIR is not set (.ci/run points it at ../shared/conformance/vectors)")
	}
	vectors := loadVectors(t, dir)
	for _, name := range availableStores(t) {
		t.Run(name, func(t *testing.T) {
			for _, profile := range []struct {
				name  string
				env   map[string]string
				tiers []string
			}{
				{"defaults", map[string]string{}, []string{"core"}},
				{"profile", map[string]string{"IDEM_REPLAY_HEADER": "Idempotency-Replayed"}, []string{"core", "profile"}},
			} {
				t.Run(profile.name, func(t *testing.T) {
					env := storeEnv(t, name)
					for k, v := range profile.env {
						env[k] = v
					}
					base := startServer(t, env)
					for _, v := range vectors {
						if !slices.Contains(profile.tiers, v.Tier) {
							continue
						}
						t.Run(v.ID, func(t *testing.T) {
							if slices.Contains(v.Requires, "short-ttl") {
								t.Skip("vector needs a retention of at most 2 s")
							}
							runVector(t, base, v)
						})
					}
				})
			}
		})
	}
}

func runVector(t *testing.T, base string, v vector) {
	if r := send(base, "POST", "/reset", nil, nil); r.err != nil || r.status != http.StatusNoContent {
		t.Fatalf("reset: %d %v", r.status, r.err)
	}
	pendingLater := map[string]bool{}
	for _, s := range v.Steps {
		for _, id := range s.ConcurrentWith {
			pendingLater[id] = true
		}
	}
	replies := map[string]reply{}
	pending := map[string]chan reply{}
	byID := map[string]step{}
	for _, s := range v.Steps {
		byID[s.ID] = s
		do := func() reply {
			var body []byte
			if s.Request.Body != nil {
				body = []byte(*s.Request.Body)
			}
			return send(base, s.Request.Method, s.Request.Path, s.Request.Headers, body)
		}
		if pendingLater[s.ID] {
			ch := make(chan reply, 1)
			go func() { ch <- do() }()
			pending[s.ID] = ch
			continue
		}
		group := []string{s.ID}
		if len(s.ConcurrentWith) > 0 {
			time.Sleep(time.Duration(s.DelayMs) * time.Millisecond) // the vector's own timing
		}
		replies[s.ID] = do()
		for _, id := range s.ConcurrentWith {
			replies[id] = <-pending[id]
			delete(pending, id)
			group = append(group, id)
		}
		for _, id := range group {
			check(t, byID[id], replies[id], replies)
		}
		for _, id := range group {
			if want := byID[id].Expect.HandlerInvocations; want != nil {
				if got := counter(t, base); got != *want {
					t.Errorf("step %s: handler ran %d times, want %d", id, got, *want)
				}
			}
		}
	}
	for id, ch := range pending {
		t.Errorf("step %s was left pending by the vector", id)
		<-ch
	}
}

func send(base, method, path string, headers map[string]string, body []byte) reply {
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func counter(t *testing.T, base string) int {
	t.Helper()
	r := send(base, "GET", "/counter", nil, nil)
	var c struct {
		Count int `json:"count"`
	}
	if r.err != nil || r.status != 200 || json.Unmarshal(r.body, &c) != nil {
		t.Fatalf("GET /counter: %d %v %q", r.status, r.err, r.body)
	}
	return c.Count
}

func check(t *testing.T, s step, r reply, earlier map[string]reply) {
	t.Helper()
	if r.err != nil {
		t.Errorf("step %s: %v", s.ID, r.err)
		return
	}
	e := s.Expect
	if r.status != e.Status {
		t.Errorf("step %s: status %d, want %d (body %.200q)", s.ID, r.status, e.Status, r.body)
	}
	for name, raw := range e.Headers {
		got, present := r.header.Get(name), len(r.header.Values(name)) > 0
		var lit string
		var rule struct {
			Present *bool   `json:"present"`
			Absent  *bool   `json:"absent"`
			Regex   *string `json:"regex"`
		}
		switch {
		case json.Unmarshal(raw, &lit) == nil:
			if got != lit {
				t.Errorf("step %s: header %s = %q, want %q", s.ID, name, got, lit)
			}
		case json.Unmarshal(raw, &rule) == nil:
			if rule.Present != nil && *rule.Present && !present {
				t.Errorf("step %s: header %s absent, want present", s.ID, name)
			}
			if rule.Absent != nil && *rule.Absent && present {
				t.Errorf("step %s: header %s = %q, want absent", s.ID, name, got)
			}
			if rule.Regex != nil && !regexp.MustCompile(*rule.Regex).MatchString(got) {
				t.Errorf("step %s: header %s = %q, want match of %s", s.ID, name, got, *rule.Regex)
			}
		default:
			t.Fatalf("step %s: unreadable header expectation %s", s.ID, raw)
		}
	}
	if len(e.BodyEquals) > 0 {
		var lit string
		var same struct {
			SameAs string `json:"sameAs"`
		}
		switch {
		case json.Unmarshal(e.BodyEquals, &lit) == nil:
			if string(r.body) != lit {
				t.Errorf("step %s: body %.200q, want %q", s.ID, r.body, lit)
			}
		case json.Unmarshal(e.BodyEquals, &same) == nil && same.SameAs != "":
			if !bytes.Equal(r.body, earlier[same.SameAs].body) {
				t.Errorf("step %s: body %.200q, want the bytes of step %s (%.200q)", s.ID, r.body, same.SameAs, earlier[same.SameAs].body)
			}
		default:
			t.Fatalf("step %s: unreadable bodyEquals %s", s.ID, e.BodyEquals)
		}
	}
	if e.BodyBytes != nil && len(r.body) != *e.BodyBytes {
		t.Errorf("step %s: body of %d bytes, want %d", s.ID, len(r.body), *e.BodyBytes)
	}
	if len(e.BodyJSON) > 0 {
		var got map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Errorf("step %s: body is not a JSON object: %v", s.ID, err)
			return
		}
		for k, want := range e.BodyJSON {
			if !jsonEqual(got[k], want) {
				t.Errorf("step %s: member %s = %s, want %s", s.ID, k, got[k], want)
			}
		}
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// availableStores lists the IDEM_STORE values the environment can serve.
func availableStores(t *testing.T) []string {
	names := []string{"memory"}
	pg, rd := os.Getenv("DATABASE_URL") != "", os.Getenv("REDIS_URL") != ""
	if pg {
		names = append(names, "postgres")
	}
	if rd {
		names = append(names, "redis")
	}
	if pg && rd {
		names = append(names, "tiered")
	}
	if os.Getenv("MYSQL_DSN") != "" {
		names = append(names, "mysql")
	}
	if len(names) < 5 {
		if testenv.CI() {
			t.Fatal("CI=true but DATABASE_URL, REDIS_URL or MYSQL_DSN is unset")
		}
		t.Logf("running the vectors on %s only (set DATABASE_URL, REDIS_URL and MYSQL_DSN for the others)", strings.Join(names, ", "))
	}
	return names
}

// storeEnv is the environment of a fixture on store name, in a namespace of its
// own (table, Redis prefix) that is removed when the test ends.
func storeEnv(t *testing.T, name string) map[string]string {
	ns := "conf_" + apptest.RandomSuffix()
	env := map[string]string{
		"IDEM_STORE":        name,
		"DATABASE_URL":      os.Getenv("DATABASE_URL"),
		"REDIS_URL":         os.Getenv("REDIS_URL"),
		"MYSQL_DSN":         os.Getenv("MYSQL_DSN"),
		"IDEM_TABLE":        ns,
		"IDEM_REDIS_PREFIX": ns + ":",
	}
	t.Cleanup(func() {
		if name == "postgres" || name == "tiered" {
			apptest.DropTables(t, env["DATABASE_URL"], ns, ns)
		}
		if name == "redis" || name == "tiered" {
			apptest.DeleteRedisPrefix(t, env["REDIS_URL"], ns+":")
		}
		if name == "mysql" {
			apptest.DropMySQLTables(t, env["MYSQL_DSN"], ns)
		}
	})
	return env
}
