package main

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"
)

type principalKey struct{}

// principalFrom returns the principal the authenticate middleware put in ctx.
func principalFrom(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok
}

// scope is the idempotency middleware's ScopeFunc: the authenticated principal,
// so two principals' keys never meet and none can replay another's payment.
func scope(r *http.Request) string {
	p, _ := principalFrom(r.Context())
	return p
}

// authenticate answers 401 problem details unless the request carries
// "Authorization: Bearer <token>" with a token of tokens; otherwise it runs next
// with the token's principal in the context. It runs before the idempotency
// middleware, so a refused request claims no key.
func authenticate(tokens map[string]string, next http.Handler) http.Handler {
	type entry struct{ token, principal []byte }
	list := make([]entry, 0, len(tokens))
	for t, p := range tokens {
		list = append(list, entry{[]byte(t), []byte(p)})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		var principal string
		if strings.EqualFold(scheme, "Bearer") && token != "" {
			// Compare with every token in constant time, so the time taken does not
			// tell how much of a guess was right.
			for _, e := range list {
				if subtle.ConstantTimeCompare([]byte(token), e.token) == 1 {
					principal = string(e.principal)
				}
			}
		}
		if principal == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			writeProblem(w, http.StatusUnauthorized, codeUnauthorized,
				"Send Authorization: Bearer <token> with a token the server knows (PAYMENTS_TOKENS).", 0)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
	})
}
