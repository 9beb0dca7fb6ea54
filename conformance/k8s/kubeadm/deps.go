// Package kubeadmdeps exists only so that `go mod tidy` records every module kubeadm needs.
// Nothing runs it; `python -m controlplane build kubeadm` builds k8s.io/kubernetes/cmd/kubeadm
// inside this module.
package kubeadmdeps

import (
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
)
