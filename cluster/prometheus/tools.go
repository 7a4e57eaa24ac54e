//go:build tools

// Package prometheus pins Prometheus, the cluster's own monitoring: it
// scrapes every revision pod's queue-proxy on its request-metrics port.
// Never compiled: scripts/cluster builds cmd/prometheus, with only the
// Kubernetes service discovery (-tags remove_all_sd,enable_kubernetes_sd).
package prometheus

import _ "github.com/prometheus/prometheus/cmd/prometheus"
