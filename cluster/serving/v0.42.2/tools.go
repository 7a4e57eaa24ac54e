//go:build tools

// Package serving pins Knative Serving v0.42.2 as the cluster installs it: its
// components, its own queue-proxy, and the test images Knative's e2e
// tests run. Never compiled: scripts/cluster builds the packages named here.
package serving

import (
	_ "knative.dev/serving/cmd/activator"
	_ "knative.dev/serving/cmd/autoscaler"
	_ "knative.dev/serving/cmd/controller"
	_ "knative.dev/serving/cmd/queue"
	_ "knative.dev/serving/cmd/webhook"
	_ "knative.dev/serving/test/test_images/autoscale"
	_ "knative.dev/serving/test/test_images/failing"
	_ "knative.dev/serving/test/test_images/grpc-ping"
	_ "knative.dev/serving/test/test_images/hellohttp2"
	_ "knative.dev/serving/test/test_images/hellovolume"
	_ "knative.dev/serving/test/test_images/helloworld"
	_ "knative.dev/serving/test/test_images/httpproxy"
	_ "knative.dev/serving/test/test_images/multicontainer/servingcontainer"
	_ "knative.dev/serving/test/test_images/multicontainer/sidecarcontainer"
	_ "knative.dev/serving/test/test_images/pizzaplanetv1"
	_ "knative.dev/serving/test/test_images/pizzaplanetv2"
	_ "knative.dev/serving/test/test_images/readiness"
	_ "knative.dev/serving/test/test_images/revisionfailure"
	_ "knative.dev/serving/test/test_images/runtime"
	_ "knative.dev/serving/test/test_images/singlethreaded"
	_ "knative.dev/serving/test/test_images/slowstart"
	_ "knative.dev/serving/test/test_images/timeout"
	_ "knative.dev/serving/test/test_images/volumes"
	_ "knative.dev/serving/test/test_images/wsserver"
)
