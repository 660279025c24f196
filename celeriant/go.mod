module github.com/idemkey/idemkey/celeriant

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/idemkey/idemkey v0.1.0
)

require github.com/klauspost/compress v1.20.3
