package middleware

import (
	"context"
	"net/http"
)

// principalKey is the context key of the authenticated principal.
type principalKey struct{}

// ContextWithPrincipal returns a copy of ctx carrying principal: the
// authenticated user, API client or tenant that owns the request's idempotency
// keys. Call it in the authentication middleware, in front of this one, once the
// credentials are checked
// (r = r.WithContext(middleware.ContextWithPrincipal(r.Context(), userID))), and
// scope keys with ScopeFromPrincipal. The empty string is no principal.
func ContextWithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// WithPrincipal is ContextWithPrincipal, under the name it had among the
// options although it is none.
//
// Deprecated: use ContextWithPrincipal.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return ContextWithPrincipal(ctx, principal)
}

// PrincipalFromContext returns the principal ContextWithPrincipal put in ctx; ok is false
// when there is none (or it is empty).
func PrincipalFromContext(ctx context.Context) (principal string, ok bool) {
	p, _ := ctx.Value(principalKey{}).(string)
	return p, p != ""
}

// ScopeFromPrincipal returns the ScopeFunc to use behind an authentication
// middleware: the scope of a request is its principal (ContextWithPrincipal), so two
// principals sending the same key never see each other's responses
// (docs/architecture.md section 3, "Scope"). A request without a principal gets
// unauthenticated: pass a value no principal can take (for example "anonymous" when
// principals are user IDs), or reject such requests before this middleware. An
// empty unauthenticated puts them all in the global scope.
func ScopeFromPrincipal(unauthenticated string) ScopeFunc {
	return func(r *http.Request) string {
		if p, ok := PrincipalFromContext(r.Context()); ok {
			return p
		}
		return unauthenticated
	}
}
