//go:build tools

// Package oracle pins the Knative queue-proxy that qproxy is compared with (current Knative).
// It is never compiled: the build tag only lets `go mod tidy` record the
// dependencies of knative.dev/serving/cmd/queue, which build.sh builds.
package oracle

import _ "knative.dev/serving/cmd/queue"
