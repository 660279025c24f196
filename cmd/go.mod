module github.com/idemkey/idemkey/cmd

go 1.26.0

replace github.com/idemkey/idemkey/celeriant => ../celeriant

require (
	github.com/google/uuid v1.6.0
	github.com/idemkey/idemkey/celeriant v0.0.0-00010101000000-000000000000
)

require (
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/idemkey/idemkey => ..
