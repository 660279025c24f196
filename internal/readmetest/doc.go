// Package readmetest holds tests only: they keep the README's snippets equal to
// the compiled files they mirror, and the OpenAPI fragment (docs) in step with
// the middleware's headers and problem codes.
package readmetest
