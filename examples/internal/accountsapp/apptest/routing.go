package apptest

import (
	"net/http"
	"testing"

	"github.com/google/uuid"
)

// routerAnswers checks that no answer of the router itself spends a key: for
// each request no API route serves (a method the route does not take, a path
// no route has, POST on the GET-only stream), the 404 or 405 is not stored, so
// the corrected request with the same key runs (200, not replayed), and is
// replayed after.
func routerAnswers(t *testing.T, s *Server) {
	acct := uuid.NewString()
	dep := "/api/accounts/" + acct + "/deposit"
	body := `{"amountCents":1}`
	for i, miss := range []struct {
		method, path string
		status       int
	}{
		{"PATCH", dep, http.StatusMethodNotAllowed},
		{"PATCH", "/api/transfers", http.StatusMethodNotAllowed},
		{"POST", "/api/watch/stream", http.StatusMethodNotAllowed},
		{"PATCH", "/api/watch/stream", http.StatusMethodNotAllowed},
		{"POST", "/api/accounts", http.StatusMethodNotAllowed},
		{"POST", "/api/accounts/" + acct + "/balance", http.StatusMethodNotAllowed},
		{"POST", "/api/nothing", http.StatusNotFound},
		{"POST", "/api/accounts/" + acct + "/deposits", http.StatusNotFound},
		{"POST", dep + "/more", http.StatusNotFound},
		{"PATCH", "/api/nothing", http.StatusNotFound},
	} {
		key := "router-" + uuid.NewString()
		if r := Do(t, miss.method, s.URL+miss.path, key, "", body); r.Status != miss.status {
			t.Errorf("%s %s: %d, want %d: %.200s", miss.method, miss.path, r.Status, miss.status, r.Body)
			continue
		}
		r := Do(t, "POST", s.URL+dep, key, "", body)
		if r.Status != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("after %s %s (%d) the deposit with its key: %d replayed=%q, want a first 200: %.200s",
				miss.method, miss.path, miss.status, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
			continue
		}
		if r := Do(t, "POST", s.URL+dep, key, "", body); r.Status != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("case %d: the deposit's retry: %d replayed=%q, want a replay", i, r.Status, r.Header.Get("Idempotent-Replayed"))
		}
	}
}

// anonymousClientID checks that a client sending the anonymous scope's name as
// its X-Client-ID does not share the keyless clients' scope: with the key a
// keyless client used, its deposit runs (not a replay of the keyless one), and
// the keyless client's retry still replays its own answer.
func anonymousClientID(t *testing.T, s *Server) {
	dep := "/api/accounts/" + uuid.NewString() + "/deposit"
	key := "anon-" + uuid.NewString()
	first := Do(t, "POST", s.URL+dep, key, "", `{"amountCents":5}`)
	if first.Status != http.StatusOK {
		t.Fatalf("keyless client's deposit: %d %s", first.Status, first.Body)
	}
	named := Do(t, "POST", s.URL+dep, key, "anonymous", `{"amountCents":5}`)
	if named.Status != http.StatusOK || named.Header.Get("Idempotent-Replayed") != "" || named.Body == first.Body {
		t.Fatalf("X-Client-ID: anonymous with the keyless client's key: %d replayed=%q %s, want its own first 200 (keyless got %s)",
			named.Status, named.Header.Get("Idempotent-Replayed"), named.Body, first.Body)
	}
	if again := Do(t, "POST", s.URL+dep, key, "", `{"amountCents":5}`); again.Body != first.Body || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("keyless client's retry: %d %s, want the replay of %s", again.Status, again.Body, first.Body)
	}
}
