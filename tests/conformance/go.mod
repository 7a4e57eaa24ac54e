module qproxy.test/conformance

go 1.25

require (
	github.com/gorilla/websocket v1.5.0
	golang.org/x/net v0.27.0
	google.golang.org/protobuf v1.34.1
	gopkg.in/yaml.v3 v3.0.1
)

require golang.org/x/text v0.16.0 // indirect
