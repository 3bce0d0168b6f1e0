package main

// The zero-cost extender: the extender verbs gpufrag-extender serves (filter, prioritize,
// preempt, bind), with the same wire types and the same configuration in kube-scheduler, but no
// logic at all. It is the reference row of benchmarks/scheduling_throughput.py: what the
// extender design itself costs (a JSON round trip per verb, one Binding per pod), so that
// gpufrag's figure can be read against the limit of the design as well as against the default
// scheduler.
//
// Usage: zero-extender --kubeconfig FILE --port N [--mode all|one]
//   all: the filter passes every node it is sent (as gpufrag with filter.answer: feasible)
//   one: the filter passes the first node only (as gpufrag's deciding filter)
// Prioritize scores every node 0; preempt keeps kube-scheduler's candidates as sent; bind
// creates the Binding (as gpufrag does, in one write).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func init() {
	components["zero-extender"] = runZeroExtender
}

type zeroExtender struct {
	client  kubernetes.Interface
	oneNode bool
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		http.Error(w, fmt.Sprintf(`{"Error":%q}`, err.Error()), http.StatusBadRequest)
		return false
	}
	return true
}

func reply(w http.ResponseWriter, value any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(value)
}

func (z *zeroExtender) filter(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if !decode(w, r, &args) {
		return
	}
	result := extenderv1.ExtenderFilterResult{Nodes: args.Nodes, NodeNames: args.NodeNames}
	if z.oneNode && args.NodeNames != nil && len(*args.NodeNames) > 1 {
		first := (*args.NodeNames)[:1]
		result.NodeNames = &first
	}
	if z.oneNode && args.Nodes != nil && len(args.Nodes.Items) > 1 {
		result.Nodes = &v1.NodeList{Items: args.Nodes.Items[:1]}
	}
	reply(w, result)
}

func (z *zeroExtender) prioritize(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if !decode(w, r, &args) {
		return
	}
	var names []string
	if args.NodeNames != nil {
		names = *args.NodeNames
	} else if args.Nodes != nil {
		for _, node := range args.Nodes.Items {
			names = append(names, node.Name)
		}
	}
	result := make(extenderv1.HostPriorityList, 0, len(names))
	for _, name := range names {
		result = append(result, extenderv1.HostPriority{Host: name, Score: 0})
	}
	reply(w, result)
}

func (z *zeroExtender) preempt(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderPreemptionArgs
	if !decode(w, r, &args) {
		return
	}
	result := extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: args.NodeNameToMetaVictims}
	if result.NodeNameToMetaVictims == nil {
		result.NodeNameToMetaVictims = map[string]*extenderv1.MetaVictims{}
		for node, victims := range args.NodeNameToVictims {
			meta := &extenderv1.MetaVictims{NumPDBViolations: victims.NumPDBViolations}
			for _, pod := range victims.Pods {
				meta.Pods = append(meta.Pods, &extenderv1.MetaPod{UID: string(pod.UID)})
			}
			result.NodeNameToMetaVictims[node] = meta
		}
	}
	reply(w, result)
}

func (z *zeroExtender) bind(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderBindingArgs
	if !decode(w, r, &args) {
		return
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: args.PodNamespace, Name: args.PodName, UID: args.PodUID},
		Target:     v1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	result := extenderv1.ExtenderBindingResult{}
	if err := z.client.CoreV1().Pods(args.PodNamespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		result.Error = err.Error()
	}
	reply(w, result)
}

func runZeroExtender(args []string) int {
	flags := flag.NewFlagSet("zero-extender", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster to bind in")
	host := flags.String("host", "127.0.0.1", "address to listen on")
	port := flags.Int("port", 8889, "port to listen on")
	mode := flags.String("mode", "all", "filter answer: all (every node sent) or one (the first)")
	qps := flags.Float64("qps", 1000, "client QPS towards the API server (binds)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *mode != "all" && *mode != "one" {
		fmt.Fprintf(os.Stderr, "zero-extender: --mode must be all or one, got %q\n", *mode)
		return 2
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zero-extender: %v\n", err)
		return 2
	}
	config.QPS, config.Burst = float32(*qps), int(2**qps)
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zero-extender: %v\n", err)
		return 1
	}
	z := &zeroExtender{client: client, oneNode: *mode == "one"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", z.filter)
	mux.HandleFunc("POST /prioritize", z.prioritize)
	mux.HandleFunc("POST /preempt", z.preempt)
	mux.HandleFunc("POST /bind", z.bind)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	listener, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "zero-extender: %v\n", err)
		return 1
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = server.Close()
	}()
	fmt.Fprintf(os.Stderr, "zero-extender: serving on %s (mode %s)\n", listener.Addr(), *mode)
	if err := server.Serve(listener); err != nil && err != http.ErrServerClosed {
		fmt.Fprintf(os.Stderr, "zero-extender: %v\n", err)
		return 1
	}
	return 0
}
