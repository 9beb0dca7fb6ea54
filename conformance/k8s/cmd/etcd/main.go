// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the
// version k8s.io/kubernetes v1.37.2 itself requires, so that the control
// plane's etcd comes from the same module graph as the API server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
