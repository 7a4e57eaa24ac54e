//go:build tools

// Package tools pins containerd, its runc shim and its ctr client: the
// cluster's container runtime, built from the published module.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
