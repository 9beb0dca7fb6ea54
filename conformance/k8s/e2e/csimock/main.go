// csi-mock serves the mock CSI driver that ships inside k8s.io/kubernetes
// (test/e2e/storage/drivers/csi-test/mock, the one the upstream "CSI mock
// volume" e2e tests deploy) on a Unix socket, and the kubelet plugin
// registration service (pluginregistration v1: what node-driver-registrar does,
// which the Go module proxy does not serve) on a second one, so that a node
// agent finds it in its plugins-registry directory. Test code only.
//
// Build: python -m controlplane build csi-mock
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

type registration struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.name, Endpoint: r.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(ctx context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		fmt.Fprintf(os.Stderr, "csi-mock: registration refused: %s\n", s.Error)
	} else {
		fmt.Fprintf(os.Stderr, "csi-mock: registered\n")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func listen(path string) net.Listener {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "csi-mock: listen %s: %v\n", path, err)
		os.Exit(1)
	}
	return l
}

func main() {
	endpoint := flag.String("endpoint", "", "the CSI socket to serve")
	registrationSocket := flag.String("registration-socket", "", "the plugin registration socket to serve (in the node's plugins-registry directory)")
	name := flag.String("name", service.Name, "the driver name")
	disableAttach := flag.Bool("disable-attach", false, "no ControllerPublishVolume step (CSIDriver attachRequired: false)")
	nodeExpansion := flag.Bool("node-expansion", false, "advertise EXPAND_VOLUME")
	attachLimit := flag.Int64("attach-limit", 0, "max_volumes_per_node")
	topology := flag.Bool("enable-topology", false, "report the mock topology segment")
	permissive := flag.Bool("permissive-target-path", true, "accept a target path that exists")
	flag.Parse()
	if *endpoint == "" || *registrationSocket == "" {
		fmt.Fprintln(os.Stderr, "csi-mock: --endpoint and --registration-socket are required")
		os.Exit(2)
	}
	svc := service.New(service.Config{DisableAttach: *disableAttach, DriverName: *name, AttachLimit: *attachLimit,
		NodeExpansionRequired: *nodeExpansion, EnableTopology: *topology, PermissiveTargetPath: *permissive})
	csi := driver.NewCSIDriver(&driver.CSIDriverServers{Controller: svc, Identity: svc, Node: svc})
	if err := csi.Start(listen(*endpoint), nil); err != nil {
		fmt.Fprintf(os.Stderr, "csi-mock: %v\n", err)
		os.Exit(1)
	}
	reg := grpc.NewServer()
	registerapi.RegisterRegistrationServer(reg, &registration{name: *name, endpoint: *endpoint})
	go func() { _ = reg.Serve(listen(*registrationSocket)) }()
	fmt.Fprintf(os.Stderr, "csi-mock: serving %s on %s (registration %s)\n", *name, *endpoint, *registrationSocket)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	reg.Stop()
	csi.Stop()
	_ = os.Remove(*registrationSocket)
	_ = os.Remove(*endpoint)
}
