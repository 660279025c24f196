module github.com/idemkey/idemkey/middleware/echov5

go 1.26.0

require github.com/idemkey/idemkey v0.1.0

require (
	github.com/labstack/echo/v5 v5.4.6
	golang.org/x/time v0.15.0 // indirect
)
