// Command cluster is the upstream Kubernetes control plane as one multi-call binary: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, plus a node (the kubelet
// and, where the sandbox cannot run containers, upstream's fake CRI runtime "fake-cri"), built
// from the published Go modules for gpufrag's end-to-end tests.
//
// One binary instead of five because the five share almost all of their dependency graph: one
// link is far cheaper than five, and the test harness has one file to cache. The component is
// chosen by the first argument ("cluster kube-apiserver --etcd-servers=...") or, when the binary
// is invoked through a symlink named after a component, by argv[0] (as hyperkube used to do).
package main

import (
	"fmt"
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // CronJob time zones, as the upstream kube-apiserver/controller-manager mains.

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream mains.
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream mains.
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream mains.
	fakecri "k8s.io/cri-client/pkg/fake"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// components maps a component name to its entry point. Each entry point receives the
// component's own arguments (without the component name) and returns the process exit code.
var components = map[string]func(args []string) int{
	"etcd": func(args []string) int {
		// etcdmain.Main reads its flags from args[1:], like os.Args; it exits on its own.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return 0
	},
	"kube-apiserver": func(args []string) int {
		return runCobra(apiserver.NewAPIServerCommand(), args)
	},
	"kube-controller-manager": func(args []string) int {
		return runCobra(controllermanager.NewControllerManagerCommand(), args)
	},
	"kube-scheduler": func(args []string) int {
		return runCobra(scheduler.NewSchedulerCommand(), args)
	},
	"kubectl": runKubectl,
	"kubelet": func(args []string) int {
		// As cmd/kubelet/kubelet.go.
		return runCobra(kubelet.NewKubeletCommand(context.Background()), args)
	},
	"fake-cri": runFakeCRI,
}

// runFakeCRI serves upstream's fake CRI runtime (k8s.io/cri-client/pkg/fake, the one the
// kubelet's own remote-runtime tests use) on a unix socket: a kubelet pointed at it admits pods,
// runs the device manager and walks the pod lifecycle, but no container ever starts. It is the
// node's runtime where the sandbox cannot run containers. Usage: fake-cri unix:///path/cri.sock
func runFakeCRI(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: fake-cri unix:///path/to/cri.sock")
		return 2
	}
	runtime := fakecri.NewFakeRemoteRuntime()
	if err := runtime.Start(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fake-cri: serving on %s\n", args[0])
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	runtime.Stop()
	return 0
}

// runCobra runs an upstream component command the way its own main does (cli.Run sets up
// logging flags and flushes logs), with the arguments that follow the component name.
func runCobra(command *cobra.Command, args []string) int {
	command.SetArgs(args)
	return cli.Run(command)
}

// runKubectl mirrors cmd/kubectl/kubectl.go: kubectl parses its verbosity before building the
// command and prints errors in its own format.
func runKubectl(args []string) int {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(append([]string{"kubectl"}, args...))) //nolint:errcheck
	// kubectl looks at os.Args itself (plugins, .kuberc), so make them look like a plain kubectl.
	os.Args = append([]string{"kubectl"}, args...)
	command := kubectlcmd.NewDefaultKubectlCommand()
	command.SetArgs(args)
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err) // exits non-zero
	}
	return 0
}

func names() string {
	out := make([]string, 0, len(components))
	for name := range components {
		out = append(out, name)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// exitWithParent makes the component exit once the process named by GPUFRAG_EXIT_WITH_PARENT
// (the test harness) is no longer its parent. A harness killed with SIGKILL runs no cleanup, and
// an orphaned kube-apiserver or etcd would hold its ports and memory until someone noticed.
func exitWithParent() {
	want, err := strconv.Atoi(os.Getenv("GPUFRAG_EXIT_WITH_PARENT"))
	if err != nil || want <= 0 {
		return
	}
	check := func() {
		if os.Getppid() != want {
			fmt.Fprintf(os.Stderr, "cluster: parent process %d is gone; exiting\n", want)
			os.Exit(3)
		}
	}
	check()
	go func() {
		for range time.Tick(500 * time.Millisecond) {
			check()
		}
	}()
}

func main() {
	exitWithParent()
	// argv[0] dispatch first (a symlink named "kube-apiserver"), then the first argument.
	if run, ok := components[filepath.Base(os.Args[0])]; ok {
		os.Exit(run(os.Args[1:]))
	}
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: %s <component> [flags]\ncomponents: %s\n", filepath.Base(os.Args[0]), names())
		os.Exit(2)
	}
	run, ok := components[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown component %q; one of: %s\n", filepath.Base(os.Args[0]), os.Args[1], names())
		os.Exit(2)
	}
	// Components read os.Args in places (etcd's flag parsing, kubectl's plugin lookup): present
	// them with the arguments a single-purpose binary would have seen.
	os.Args = append([]string{os.Args[1]}, os.Args[2:]...)
	os.Exit(run(os.Args[1:]))
}
