// Package readmetest holds tests only: they keep the snippets of README.md and
// docs/*.md equal to the compiled files they mirror, and the OpenAPI fragment (docs)
// in step with the middleware's headers and problem codes.
package readmetest
