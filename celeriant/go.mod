module github.com/idemkey/idemkey/celeriant

go 1.26.0

replace github.com/idemkey/idemkey => ..

require (
	github.com/google/uuid v1.6.0
	github.com/idemkey/idemkey v0.0.0-00010101000000-000000000000
)

require github.com/klauspost/compress v1.20.3
