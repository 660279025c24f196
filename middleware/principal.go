package middleware

import (
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/idemkey/idemkey/internal/httpfield"
	"github.com/idemkey/idemkey/store"
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
// unauthenticated (for example "anonymous"), or reject such requests before this
// middleware. An empty unauthenticated puts them all in the global scope.
//
// A principal whose name is unauthenticated does not share the unauthenticated
// requests' scope: its scope is its name after a NUL byte, and so is the scope of
// a principal whose name starts with a NUL byte, so no two principals, nor a
// principal and the unauthenticated requests, ever share a scope. Every other
// principal's scope is its name. It panics when unauthenticated is over
// store.MaxScopeLen bytes, which would answer every such request 400.
func ScopeFromPrincipal(unauthenticated string) ScopeFunc {
	checkFallback("ScopeFromPrincipal", unauthenticated)
	return func(r *http.Request) string {
		if p, ok := PrincipalFromContext(r.Context()); ok {
			return ownScope(p, unauthenticated)
		}
		return unauthenticated
	}
}

// checkFallback panics on a scope for requests without a client that no scope
// may be: a misconfiguration, refused when the ScopeFunc is built.
func checkFallback(fn, scope string) {
	if len(scope) > store.MaxScopeLen {
		panic(fmt.Sprintf("idemkey/middleware: %s: fallback scope of %d bytes, over store.MaxScopeLen (%d)", fn, len(scope), store.MaxScopeLen))
	}
}

// ownScope is the scope of principal p when requests without one get
// unauthenticated: p, or p after a NUL byte when p is unauthenticated or starts
// with NUL (an injective mapping whose values never equal unauthenticated).
func ownScope(p, unauthenticated string) string {
	if p == unauthenticated || p[0] == 0 {
		return "\x00" + p
	}
	return p
}

// ScopeFromHeader returns a ScopeFunc that reads the request header name, and
// returns fallback when it is absent or empty.
//
// It is a stand-in for tests and demos: any client can send any header value and
// so read another client's stored responses by guessing its keys. In production
// scope by the authenticated principal (ContextWithPrincipal and ScopeFromPrincipal), or
// use ScopeFromHeader only behind a gateway that authenticates the header and
// strips it from client requests.
//
// The keyless clients' scope (fallback) is never shared with a client that sends
// the fallback's value in the header: such a request gets its own scope, the value
// prefixed with a NUL byte, which no header value can carry (RFC 9110 section
// 5.5), so it cannot be forged either. With ScopeFromHeader("X-Client-ID",
// "anonymous"), "X-Client-ID: anonymous" does not see the keyless clients'
// records. The middleware answers 400 idempotency_scope_invalid, before asking
// the store, to a header sent on several lines (which one names the client?
// the same rule as for the Idempotency-Key header), and to a value over
// store.MaxScopeLen bytes.
//
// It panics when name is not a header field name (an RFC 9110 section 5.1
// token): no request carries such a header, so every client would share the
// fallback's scope and replay the others' answers; and when fallback is over
// store.MaxScopeLen bytes, which would answer every keyless client 400.
func ScopeFromHeader(name, fallback string) ScopeFunc {
	if !httpfield.ValidName(name) {
		panic(fmt.Sprintf("idemkey/middleware: ScopeFromHeader: %q is not a header field name", name))
	}
	checkFallback("ScopeFromHeader", fallback)
	name = textproto.CanonicalMIMEHeaderKey(name)
	return func(r *http.Request) string {
		switch v := r.Header[name]; {
		case len(v) > 1:
			return severalLinesScope
		case len(v) == 0 || v[0] == "":
			return fallback
		case v[0] == fallback:
			return "\x00" + fallback
		default:
			return v[0]
		}
	}
}

// severalLinesScope is what ScopeFromHeader returns for a header sent on
// several lines: longer than store.MaxScopeLen, so no valid scope equals it and
// the middleware refuses it (scopeProblem tells it from a long scope).
var severalLinesScope = strings.Repeat("\x00", store.MaxScopeLen+1)

// scopeProblem is the 400 answer to a scope the middleware refuses (over
// store.MaxScopeLen bytes): a header on several lines, or a long scope.
func (p *prerendered) scopeProblem(scope string) []byte {
	if scope == severalLinesScope {
		return p.scopeSeveral
	}
	return p.scopeTooLong
}
