package middleware

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey/fingerprint"
)

// chargeHandler reads the body as a payments handler does, with encoding/json
// into a struct, and answers what it charged.
func chargeHandler(w http.ResponseWriter, r *http.Request) {
	var p struct {
		Amount int    `json:"amount"`
		To     string `json:"to"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "charged %d to %s", p.Amount, p.To)
}

// No retry is ever answered with what another body charged: for every pair of
// bodies sent with one key (spellings of "amount" that encoding/json reads as
// one field, duplicated in both orders, or alone with another value), the
// second is refused (400, 422) or answered what the handler answers it.
func TestJSONRulesNeverReplayAnotherReading(t *testing.T) {
	spell := []string{"amount", "AMOUNT", "Amount", `\u0061mount`, `amoun\u0074`, `\u0041mount`}
	var pairs [][2]string
	for _, a := range spell {
		pairs = append(pairs, [2]string{`{"` + a + `":5,"to":"x"}`, `{"` + a + `":7,"to":"x"}`})
		for _, b := range spell {
			pairs = append(pairs,
				[2]string{`{"` + a + `":2,"` + b + `":1,"to":"x"}`, `{"` + b + `":1,"` + a + `":2,"to":"x"}`},
				[2]string{`{"` + a + `":1,"to":"x"}`, `{"` + b + `":1,"to":"x"}`})
		}
	}
	rules := map[string]FingerprintRule{
		"canonical": {CanonicalJSON: true},
		"only":      {Body: mustRule(t)(fingerprint.OnlyJSONFields("/amount", "/to"))},
		"ignore":    {Body: mustRule(t)(fingerprint.IgnoreJSONFields("/sentAt"))},
	}
	for name, rule := range rules {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, chargeHandler, WithRequestFingerprint(rule))
			for i, p := range pairs {
				key := "k" + strconv.Itoa(i)
				first := e.do(req("POST", "/payments", key, p[0]))
				second := e.do(req("POST", "/payments", key, p[1]))
				direct := httptestDo(chargeHandler, p[1])
				switch second.Code {
				case http.StatusBadRequest, http.StatusUnprocessableEntity:
					if name != "canonical" && first.Code == http.StatusBadRequest {
						checkProblem(t, first, http.StatusBadRequest, CodeBodyDuplicateName)
					}
				default:
					if second.Body.String() != direct {
						t.Errorf("%s then %s: the second got %q (first %q), its own answer is %q", p[0], p[1], second.Body, first.Body, direct)
					}
				}
			}
		})
	}
}

func httptestDo(h http.HandlerFunc, body string) string {
	w := httptest.NewRecorder()
	h(w, req("POST", "/payments", "", body))
	return w.Body.String()
}
