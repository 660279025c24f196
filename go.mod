module github.com/idemkey/idemkey

go 1.26.0
