// Command dpharness runs kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager,
// unmodified, from k8s.io/kubernetes v1.36.3) outside a kubelet, so gpufrag's device plugin is
// tested against the code that will really talk to it: the registration server on a socket,
// the per-plugin gRPC client with its ListAndWatch stream, device accounting and health,
// GetPreferredAllocation, Allocate, PreStartContainer, and the checkpoint file.
//
// Why a //go:linkname: the exported constructor NewManagerImpl hard-codes the socket path
// pluginapi.KubeletSocket (/var/lib/kubelet/device-plugins/kubelet.sock) and creates that
// directory for its checkpoint. The constructor that takes a path, newManagerImpl, is
// unexported (upstream's own tests call it from inside the package). The harness pulls that
// one symbol by name, so the manager runs as the kubelet runs it, on a temporary directory,
// without touching /var/lib/kubelet. Everything else is the package's exported API.
//
// Protocol: one JSON object per line on stdin, one JSON reply per line on stdout (klog goes to
// stderr). Every reply has "ok"; failures carry "error".
//
//	{"op":"wait","resource":R,"capacity":N,"allocatable":M,"timeout_s":T}
//	    until the manager reports capacity N and allocatable (healthy) M for R
//	{"op":"devices"}
//	    capacity, allocatable and the healthy device IDs of every resource
//	{"op":"allocate","pod":{"uid":U,"name":N,"namespace":NS},
//	 "init_containers":[{"name":C,"limits":{R:n}}],"containers":[...]}
//	    what the kubelet does at admission and container start: Allocate for every init and
//	    app container in order, then GetDeviceRunContainerOptions (PreStartContainer when the
//	    plugin asks for it) for each; replies the envs, devices, mounts and annotations per
//	    container and the device IDs the manager picked
//	{"op":"release","pod_uid":U}
//	    the pod is no longer active: its devices return at the next allocation
//	{"op":"quit"}
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node,
	topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool  { return true }

type container struct {
	Name   string           `json:"name"`
	Limits map[string]int64 `json:"limits"`
}

type request struct {
	Op          string `json:"op"`
	Resource    string `json:"resource"`
	Capacity    *int64 `json:"capacity"`
	Allocatable *int64 `json:"allocatable"`
	TimeoutS    float64 `json:"timeout_s"`
	Pod         struct {
		UID       string `json:"uid"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"pod"`
	InitContainers []container `json:"init_containers"`
	Containers     []container `json:"containers"`
	PodUID         string      `json:"pod_uid"`
}

type device struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

type mount struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	ReadOnly      bool   `json:"read_only"`
}

type containerResult struct {
	Envs        map[string]string   `json:"envs"`
	Devices     []device            `json:"devices"`
	Mounts      []mount             `json:"mounts"`
	Annotations map[string]string   `json:"annotations"`
	DeviceIDs   map[string][]string `json:"device_ids"`
}

type harness struct {
	manager *devicemanager.ManagerImpl
	mu      sync.Mutex
	active  map[string]*v1.Pod
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(h.active))
	for _, p := range h.active {
		pods = append(pods, p)
	}
	return pods
}

func counts(list v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for name, q := range list {
		out[string(name)] = q.Value()
	}
	return out
}

func (h *harness) devices() map[string]any {
	capacity, allocatable, _ := h.manager.GetCapacity()
	healthy := map[string][]string{}
	for res, devs := range h.manager.GetAllocatableDevices() {
		ids := make([]string, 0, len(devs))
		for id := range devs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		healthy[res] = ids
	}
	return map[string]any{"ok": true, "capacity": counts(capacity),
		"allocatable": counts(allocatable), "healthy": healthy}
}

func (h *harness) wait(r request) map[string]any {
	timeout := time.Duration(r.TimeoutS * float64(time.Second))
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for {
		capacity, allocatable, _ := h.manager.GetCapacity()
		c, a := capacity[v1.ResourceName(r.Resource)], allocatable[v1.ResourceName(r.Resource)]
		if (r.Capacity == nil || c.Value() == *r.Capacity) &&
			(r.Allocatable == nil || a.Value() == *r.Allocatable) && c.Value() > 0 {
			return h.devices()
		}
		if time.Now().After(deadline) {
			reply := h.devices()
			reply["ok"] = false
			reply["error"] = fmt.Sprintf("timed out after %s waiting for %s capacity=%v allocatable=%v",
				timeout, r.Resource, deref(r.Capacity), deref(r.Allocatable))
			return reply
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deref(v *int64) any {
	if v == nil {
		return "any"
	}
	return *v
}

func toContainers(list []container) []v1.Container {
	out := make([]v1.Container, 0, len(list))
	for _, c := range list {
		limits := v1.ResourceList{}
		for name, n := range c.Limits {
			limits[v1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		out = append(out, v1.Container{Name: c.Name, Image: "none",
			Resources: v1.ResourceRequirements{Limits: limits, Requests: limits}})
	}
	return out
}

func (h *harness) allocate(r request) map[string]any {
	pod := &v1.Pod{}
	pod.UID = types.UID(r.Pod.UID)
	pod.Name = r.Pod.Name
	pod.Namespace = r.Pod.Namespace
	pod.Spec.InitContainers = toContainers(r.InitContainers)
	pod.Spec.Containers = toContainers(r.Containers)
	h.mu.Lock()
	h.active[r.Pod.UID] = pod
	h.mu.Unlock()
	all := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	// Admission: the topology manager's container scope calls Allocate for every init
	// container, then every app container, in order (pkg/kubelet/cm/topologymanager/scope.go).
	for i := range all {
		if err := h.manager.Allocate(pod, &all[i]); err != nil {
			h.mu.Lock()
			delete(h.active, r.Pod.UID) // a rejected pod is not active
			h.mu.Unlock()
			return map[string]any{"ok": false, "stage": "allocate", "container": all[i].Name,
				"error": err.Error()}
		}
	}
	results := map[string]containerResult{}
	for i := range all {
		opts, err := h.manager.GetDeviceRunContainerOptions(context.Background(), pod, &all[i])
		if err != nil {
			return map[string]any{"ok": false, "stage": "start", "container": all[i].Name,
				"error": err.Error()}
		}
		res := containerResult{Envs: map[string]string{}, Annotations: map[string]string{},
			Devices: []device{}, Mounts: []mount{}, DeviceIDs: map[string][]string{}}
		if opts != nil {
			for _, e := range opts.Envs {
				res.Envs[e.Name] = e.Value
			}
			for _, d := range opts.Devices {
				res.Devices = append(res.Devices, device{d.PathOnHost, d.PathInContainer, d.Permissions})
			}
			for _, m := range opts.Mounts {
				res.Mounts = append(res.Mounts, mount{m.HostPath, m.ContainerPath, m.ReadOnly})
			}
			for _, a := range opts.Annotations {
				res.Annotations[a.Name] = a.Value
			}
		}
		for name, devs := range h.manager.GetDevices(r.Pod.UID, all[i].Name) {
			ids := make([]string, 0, len(devs))
			for id := range devs {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			res.DeviceIDs[name] = ids
		}
		results[all[i].Name] = res
	}
	return map[string]any{"ok": true, "containers": results}
}

func main() {
	klog.InitFlags(nil)
	dir := flag.String("dir", "", "the device-plugin socket directory (kubelet.sock is created in it)")
	flag.Parse()
	if *dir == "" || !filepath.IsAbs(*dir) {
		fmt.Fprintln(os.Stderr, "dpharness: --dir must be an absolute directory")
		os.Exit(2)
	}
	logger := klog.Background()
	h := &harness{active: map[string]*v1.Pod{}}
	manager, err := newManagerImpl(logger, filepath.Join(*dir, "kubelet.sock"), nil,
		topologymanager.NewFakeManager())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dpharness:", err)
		os.Exit(1)
	}
	h.manager = manager
	if err := manager.Start(logger, h.activePods, allReady{}, containermap.NewContainerMap(),
		sets.New[string]()); err != nil {
		fmt.Fprintln(os.Stderr, "dpharness: starting the device manager:", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"ok": true, "event": "listening",
		"socket": filepath.Join(*dir, "kubelet.sock"), "pid": os.Getpid()})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		var r request
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			_ = out.Encode(map[string]any{"ok": false, "error": "bad request: " + err.Error()})
			continue
		}
		switch r.Op {
		case "wait":
			_ = out.Encode(h.wait(r))
		case "devices":
			_ = out.Encode(h.devices())
		case "allocate":
			_ = out.Encode(h.allocate(r))
		case "release":
			h.mu.Lock()
			delete(h.active, r.PodUID)
			h.mu.Unlock()
			_ = out.Encode(map[string]any{"ok": true})
		case "quit":
			_ = manager.Stop(logger)
			_ = out.Encode(map[string]any{"ok": true})
			return
		default:
			_ = out.Encode(map[string]any{"ok": false, "error": "unknown op " + r.Op})
		}
	}
	_ = manager.Stop(logger)
}
