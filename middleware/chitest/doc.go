// Package chitest holds tests only: they prove that chi
// (github.com/go-chi/chi/v5) needs no adapter. The net/http middleware
// ((*middleware.Middleware).Handler) on a chi router passes the decision table
// every adapter passes, and chi's route pattern can name the route in the
// fingerprint:
//
//	r := chi.NewRouter()
//	r.Group(func(r chi.Router) {
//		r.Use(m.Handler) // inside a group: runs after routing, so the pattern is known
//		r.Post("/accounts/{id}/deposit", deposit)
//	})
//
// with, to fingerprint by pattern instead of the path as sent (default; chi
// routes by the escaped path when there is one, so the default tells apart any
// two requests chi can hand to different handlers),
//
//	middleware.WithRequestFingerprint(middleware.FingerprintRule{Route: func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }})
//
// The pattern leaves the path parameters out of the fingerprint: use it only
// where the body names the resource, or a key reused on another resource is
// replayed instead of refused (422). Its own module keeps chi out of the core's
// go.mod.
package chitest
