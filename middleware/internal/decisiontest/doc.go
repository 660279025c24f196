package decisiontest

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/middleware"
)

// Observation is what the table checks of one response.
type Observation struct {
	Status   int
	Code     string // the problem's code member; "" for a handler's answer
	Replayed bool   // marked Idempotent-Replayed: true
	Omitted  bool   // marked Idempotency-Replay: omitted
}

// Observe reads an Observation from resp (its body is consumed).
func Observe(resp *http.Response) Observation {
	o := Observation{Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		Omitted: resp.Header.Get("Idempotency-Replay") == "omitted"}
	if resp.Header.Get("Content-Type") == middleware.ProblemContentType {
		var p struct{ Code string }
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &p) == nil {
			o.Code = p.Code
		}
	}
	return o
}

// tableRow is a row of the decision table: `id` | situation | answer | runs | `checked`.
var tableRow = regexp.MustCompile("^\\| `([a-z-]+)` \\|.*\\| `([^`]+)` \\|$")

// Doc returns the rows of the decision table of docs/architecture.md section 3,
// by id: the "checked" column. It fails t when the file or the table is missing.
func Doc(t testing.TB) map[string]string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "..", "docs", "architecture.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the decision table: %v", err)
	}
	text := string(b)
	start := strings.Index(text, "\n## 3. The decision table")
	end := strings.Index(text[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/architecture.md has no section 3, The decision table")
	}
	rows := make(map[string]string)
	for _, line := range strings.Split(text[start:start+1+end], "\n") {
		if m := tableRow.FindStringSubmatch(line); m != nil {
			if _, dup := rows[m[1]]; dup {
				t.Fatalf("row %q twice in the decision table", m[1])
			}
			rows[m[1]] = m[2]
		}
	}
	if len(rows) == 0 {
		t.Fatal("no row in the decision table")
	}
	return rows
}

// Matches reports whether obs shows every answer of checked, a "checked" cell:
// answers separated by "; ", each "NNN code" (a problem with that status and
// code), "replay", "replay omitted", "run" or "pass" (a handler's success, not
// replayed), or "release" (a handler's answer the claim is released for, 5xx,
// 408, 409, 425, 429, 404 or 405, then a later request that ran). A "test ..."
// cell is checked by name (TestDecisionTableDoc), never here: false.
func Matches(checked string, obs []Observation) bool {
	for _, want := range strings.Split(checked, "; ") {
		if !matchOne(want, obs) {
			return false
		}
	}
	return true
}

func matchOne(want string, obs []Observation) bool {
	for i, o := range obs {
		switch want {
		case "replay":
			if o.Replayed {
				return true
			}
		case "replay omitted":
			if o.Replayed && o.Omitted {
				return true
			}
		case "run", "pass":
			if ran(o) {
				return true
			}
		case "release":
			if o.Code == "" && released(o.Status) && ranAfter(obs[i+1:]) {
				return true
			}
		default:
			status, code, ok := strings.Cut(want, " ")
			if n, err := strconv.Atoi(status); ok && err == nil && o.Status == n && o.Code == code {
				return true
			}
		}
	}
	return false
}

func ran(o Observation) bool { return o.Status >= 200 && o.Status < 300 && !o.Replayed && o.Code == "" }

func ranAfter(obs []Observation) bool {
	for _, o := range obs {
		if ran(o) {
			return true
		}
	}
	return false
}

func released(status int) bool {
	return middleware.DefaultRelease(status) || status == http.StatusNotFound || status == http.StatusMethodNotAllowed
}
