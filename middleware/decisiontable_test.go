package middleware_test

import (
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// NetHTTPServer is the decision table's router on net/http alone: a ServeMux
// with the middleware around each route and a recover outside it.
func netHTTPServer(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := middleware.KeyFromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		run, v := a.Pay(r.PathValue("id"), id, ok, body)
		w.Header().Set("X-Run", run)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(v)
	})
	mux.HandleFunc("POST /api/slow", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Slow()) })
	mux.HandleFunc("POST /api/flaky", func(w http.ResponseWriter, r *http.Request) {
		if a.Flaky() {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "fine")
	})
	mux.HandleFunc("POST /api/panic", func(w http.ResponseWriter, r *http.Request) {
		a.Panic()
		io.WriteString(w, "fine")
	})
	mux.HandleFunc("POST /api/large", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Large()) })
	mux.HandleFunc("POST /api/refuse", func(w http.ResponseWriter, r *http.Request) {
		a.Refuse()
		http.Error(w, "no", http.StatusUnprocessableEntity)
	})
	mux.HandleFunc("GET /api/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, ok := middleware.KeyFromContext(r.Context())
		io.WriteString(w, a.Get(ok))
	})
	h := m.Handler(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// TestDecisionTableNetHTTP runs the shared decision table (the one every
// adapter runs) against the net/http middleware.
func TestDecisionTableNetHTTP(t *testing.T) { decisiontest.Run(t, netHTTPServer) }

// probes observe the rows of the decision table that the shared rows
// (decisiontest) cannot, because they need more than one middleware over a store,
// a route rule, or net/http's own ServeMux.
func probes(t *testing.T) map[string][]decisiontest.Observation {
	quiet := middleware.WithLogger(slog.New(slog.DiscardHandler))
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mw := func(st store.Store, scope middleware.ScopeFunc, next http.Handler, opts ...middleware.Option) http.Handler {
		m, err := middleware.New(st, scope, append([]middleware.Option{quiet}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(next)
	}
	do := func(h http.Handler, key, body string, hdr ...string) decisiontest.Observation {
		r := httptest.NewRequest(http.MethodPost, "/api/pay/7", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return decisiontest.Observe(w.Result())
	}
	rule, err := fingerprint.OnlyJSONFields("/amount")
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New()
	plain := mw(mem, middleware.GlobalScope, ok)
	ruled := mw(mem, middleware.GlobalScope, ok, middleware.WithRequestFingerprint(middleware.FingerprintRule{Body: rule}))
	mux := http.NewServeMux()
	mux.Handle("POST /api/pay/{id}", ok)
	unrouted := mw(memory.New(), middleware.GlobalScope, mux)
	muxMissing := func(key string) decisiontest.Observation { // POST /api/nowhere: the mux's own 404
		r := httptest.NewRequest(http.MethodPost, "/api/nowhere", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		unrouted.ServeHTTP(w, r)
		return decisiontest.Observe(w.Result())
	}
	full := mw(memory.New(memory.WithMaxBytes(1)), middleware.GlobalScope, ok)
	return map[string][]decisiontest.Observation{
		"rule-changed":        {do(plain, "rc", `{"amount":5}`), do(ruled, "rc", `{"amount":5}`)},
		"body-not-json":       {do(ruled, "nj", `amount=5`)},
		"body-duplicate-name": {do(ruled, "dn", `{"amount":1,"AMOUNT":2}`)},
		"key-refused":         {do(mw(memory.New(), middleware.GlobalScope, ok, middleware.WithKey(policy.KeyRule{Validate: policy.UUIDKeys})), "not-a-uuid", "{}")},
		"scope-invalid":       {do(mw(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anonymous"), ok), "k", "{}", "X-Client-ID", strings.Repeat("c", store.MaxScopeLen+1))},
		"unrouted":            {muxMissing("u"), do(unrouted, "u", "{}")},
		"store-full":          {do(full, "f", "{}")},
	}
}

// TestDecisionTableDoc holds docs/architecture.md section 3 to the behaviour:
// every row is covered, by a shared row (decisiontest) or a probe whose
// responses show the row's answer, or by tests that exist.
func TestDecisionTableDoc(t *testing.T) {
	doc := decisiontest.Doc(t)
	seen := decisiontest.Run(t, netHTTPServer)
	for id, obs := range probes(t) {
		seen[id] = append(seen[id], obs...)
	}
	tests := testFuncs(t)
	for id, checked := range doc {
		if names, ok := strings.CutPrefix(checked, "test "); ok {
			for _, name := range strings.Split(names, ", ") {
				if !tests[name] {
					t.Errorf("row %q names %s, which no _test.go file of the repository declares", id, name)
				}
			}
			continue
		}
		obs, ok := seen[id]
		switch {
		case !ok:
			t.Errorf("row %q (%s) is covered by no shared row or probe", id, checked)
		case !decisiontest.Matches(checked, obs):
			t.Errorf("row %q says %q; its requests got %+v", id, checked, obs)
		}
	}
	for id := range seen {
		if _, ok := doc[id]; !ok {
			t.Errorf("a shared row or probe covers %q, which the table does not have", id)
		}
	}
}

// TestDecisionTableDocDisagrees: an answer the behaviour does not give is not
// matched, whichever kind of answer it is.
func TestDecisionTableDocDisagrees(t *testing.T) {
	seen := decisiontest.Run(t, netHTTPServer)
	for id, wrong := range map[string]string{
		"in-flight": "429 request_in_flight", "mismatch": "422 fingerprint_rule_changed", "store-down": "502 store_unavailable",
		"key-missing": "run", "over-cap": "replay; 400 idempotency_key_invalid",
	} {
		if decisiontest.Matches(wrong, seen[id]) {
			t.Errorf("row %q matched %q", id, wrong)
		}
	}
}

// testFuncs returns the names of the test functions of the repository.
func testFuncs(t *testing.T) map[string]bool {
	names := make(map[string]bool)
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range decl.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
