module github.com/idemkey/idemkey/middleware/chitest

go 1.26.0

require github.com/idemkey/idemkey v0.1.0

require github.com/go-chi/chi/v5 v5.5.0
