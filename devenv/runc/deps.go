//go:build tools

// Package runcdeps exists only so that `go mod tidy` records every module
// runc needs; it is built with `go build github.com/opencontainers/runc`.
// Nothing runs it.
package runcdeps

import (
	_ "github.com/opencontainers/runc"
)
