//go:build tools

// Package containerd2deps exists only so that `go mod tidy` records every
// module the three commands below need; they are built with
// `go build github.com/containerd/containerd/v2/cmd/...`. Nothing runs it.
package containerd2deps

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
