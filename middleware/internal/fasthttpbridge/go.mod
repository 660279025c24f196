module github.com/idemkey/idemkey/middleware/internal/fasthttpbridge

go 1.26.0

require github.com/valyala/fasthttp v1.51.0

require (
	github.com/andybalholm/brotli v1.0.5 // indirect
	github.com/klauspost/compress v1.17.0 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
)
