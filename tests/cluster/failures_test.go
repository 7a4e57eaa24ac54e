package cluster

// Rollouts, a scale-down and an app that crashes, each under a load, with
// what the load's clients saw counted: the in-cluster half of the
// failure-mode suite (tests/conformance -failures has the rest). Each test
// writes its counts to QPROXY_CLUSTER_FAILURES (tests/cluster/run sets it,
// a folder per queue-proxy), and tests/cluster/run fails if qproxy's
// failures outnumber Go's.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/pkg/ptr"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	ping "knative.dev/serving/test/test_images/grpc-ping/proto"
)

// counts is what a load's clients saw, by name: a name that starts with
// "failed" counts failures.
type counts struct {
	mu sync.Mutex
	n  map[string]int
	// Some failures' texts, for the log.
	samples []string
	// When each failure was seen.
	failedAt []time.Time
}

func newCounts() *counts { return &counts{n: map[string]int{}} }

func (c *counts) add(name string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[name]++
	if err == nil {
		return
	}
	c.failedAt = append(c.failedAt, time.Now())
	if len(c.samples) < 10 {
		c.samples = append(c.samples, name+": "+err.Error())
	}
}

// set sets the count `name`, one that is not a failure.
func (c *counts) set(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[name] = n
}

// failedSince is how many failures were seen from `t` on.
func (c *counts) failedSince(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.failedAt {
		if !at.Before(t) {
			n++
		}
	}
	return n
}

// failureWindow is when the first and the last failure were seen, relative
// to `zero`.
func (c *counts) failureWindow(zero time.Time) (time.Duration, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failedAt) == 0 {
		return 0, 0
	}
	return c.failedAt[0].Sub(zero), c.failedAt[len(c.failedAt)-1].Sub(zero)
}

// record logs the counts and writes them where tests/cluster/run compares
// them with the other queue-proxy's.
func (c *counts) record(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []string
	for k := range c.n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, c.n[k]))
	}
	t.Logf("counts: %s", strings.Join(parts, ", "))
	for _, s := range c.samples {
		t.Logf("  %s", s)
	}
	dir := os.Getenv("QPROXY_CLUSTER_FAILURES")
	if dir == "" {
		return
	}
	raw, _ := json.MarshalIndent(c.n, "", "  ")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, t.Name()+".json"), raw, 0o644)
	}
}

// loadHTTP sends GETs and 64-byte POSTs to the Service `name` through the
// ingress from `workers` kept-alive clients, until stop closes.
func loadHTTP(name string, workers int, c *counts, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := client(ingress, time.Minute)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				kind := "http.get"
				var status int
				var err error
				if i%2 == 1 {
					kind = "http.post"
					status, err = post(hc, name, strings.Repeat("p", 64))
				} else {
					status, _, err = get(hc, name, "/")
				}
				c.add(kind, nil)
				if err == nil && status != 200 {
					err = fmt.Errorf("status %d", status)
				}
				if err != nil {
					c.add("failed."+kind, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	return &wg
}

// post sends a POST with `body` to the Service `name` through the ingress
// and reads the answer.
func post(hc *http.Client, name, body string) (int, error) {
	resp, err := hc.Post("http://"+host(name)+"/", "text/plain", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// loadWebSocket keeps a WebSocket open to the Service `name`, a message
// every half second, dialling again when one ends, until stop closes. A
// session that ends other than by a normal close (1000, or 1001 as a
// server going away says it) is a failure.
func loadWebSocket(name string, c *counts, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		dialer := websocket.Dialer{
			NetDial:          func(network, _ string) (net.Conn, error) { return net.Dial(network, ingress) },
			HandshakeTimeout: time.Minute,
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			conn, _, err := dialer.Dial("ws://"+host(name)+"/", nil)
			c.add("ws.sessions", nil)
			if err != nil {
				c.add("failed.ws.dial", err)
				time.Sleep(time.Second)
				continue
			}
			err = chat(conn, c, stop)
			conn.Close()
			if err != nil && !websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) {
				c.add("failed.ws.cut", err)
			}
		}
	}()
	return &wg
}

// chat echoes messages on conn until stop closes (nil) or the session ends.
func chat(conn *websocket.Conn, c *counts, stop <-chan struct{}) error {
	for i := 0; ; i++ {
		select {
		case <-stop:
			_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "done"))
			return nil
		default:
		}
		msg := fmt.Sprintf("message %d", i)
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, got, err := conn.ReadMessage()
		if err != nil {
			return err
		}
		c.add("ws.messages", nil)
		if string(got) != msg {
			c.add("failed.ws.echo", fmt.Errorf("%q for %q", got, msg))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// loadGRPC opens gRPC streams to the Service `name`, five pings each,
// until stop closes; a stream that fails is a failure.
func loadGRPC(name string, c *counts, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := grpc.NewClient("passthrough:///"+ingress,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithAuthority(host(name)))
		if err != nil {
			c.add("failed.grpc.client", err)
			return
		}
		defer conn.Close()
		pinger := ping.NewPingServiceClient(conn)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.add("grpc.streams", nil)
			if err := pingStream(pinger); err != nil {
				c.add("failed.grpc.stream", err)
				time.Sleep(200 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return &wg
}

func pingStream(pinger ping.PingServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := pinger.PingStream(ctx)
	if err != nil {
		return err
	}
	for i := 0; i < 5; i++ {
		msg := fmt.Sprintf("ping %d", i)
		if err := stream.Send(&ping.Request{Msg: msg}); err != nil {
			return err
		}
		got, err := stream.Recv()
		if err != nil {
			return err
		}
		if got.Msg != msg {
			return fmt.Errorf("%q for %q", got.Msg, msg)
		}
	}
	return stream.CloseSend()
}

// rollOut makes a new revision of the Service `name` (a new annotation on
// its template), splits the traffic 50/50 between the one before and it,
// then moves it all to the new one, waiting for each step to be Ready.
func rollOut(t *testing.T, name string, round int) {
	t.Helper()
	services := serving.ServingV1().Services(namespace)
	before := waitReady(t, name).revision
	update := func(change func(*v1.Service)) {
		eventually(t, "updating Service "+name, time.Minute, func() (bool, error) {
			svc, err := services.Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			change(svc)
			_, err = services.Update(context.Background(), svc, metav1.UpdateOptions{})
			return err == nil, nil
		})
	}
	update(func(svc *v1.Service) {
		if svc.Spec.Template.Annotations == nil {
			svc.Spec.Template.Annotations = map[string]string{}
		}
		svc.Spec.Template.Annotations["qproxy.test/rollout"] = fmt.Sprint(round)
		svc.Spec.Traffic = []v1.TrafficTarget{
			{RevisionName: before, Percent: ptr.Int64(50)},
			{LatestRevision: ptr.Bool(true), Percent: ptr.Int64(50)},
		}
	})
	waitReady(t, name)
	update(func(svc *v1.Service) {
		svc.Spec.Traffic = []v1.TrafficTarget{{LatestRevision: ptr.Bool(true), Percent: ptr.Int64(100)}}
	})
	waitReady(t, name)
}

// Ten rollouts of three Services under a mixed load: GETs and POSTs, a
// WebSocket that dials again when its session ends, gRPC streams. Every
// failure the clients see is counted.
func TestRolloutsUnderMixedLoad(t *testing.T) {
	t.Parallel()
	httpSvc := create(t, service{name: "roll-http", image: image("helloworld")})
	wsSvc := create(t, service{name: "roll-ws", image: image("wsserver")})
	grpcSvc := create(t, service{name: "roll-grpc", image: image("grpc-ping"), port: namedPort("h2c", 8080)})
	c := newCounts()
	stop := make(chan struct{})
	loads := []*sync.WaitGroup{
		loadHTTP(httpSvc.name, 4, c, stop),
		loadWebSocket(wsSvc.name, c, stop),
		loadGRPC(grpcSvc.name, c, stop),
	}
	var rollouts sync.WaitGroup
	for _, name := range []string{httpSvc.name, wsSvc.name, grpcSvc.name} {
		rollouts.Add(1)
		go func() {
			defer rollouts.Done()
			for round := 1; round <= 10; round++ {
				rollOut(t, name, round)
			}
		}()
	}
	rollouts.Wait()
	close(stop)
	for _, l := range loads {
		l.Wait()
	}
	c.record(t)
}

// A revision at five pods scales down to one under a steady load. The
// ingress (Traefik's Knative provider) reaches a revision through its
// Service's cluster IP, so each connection it keeps stays with the pod the
// cluster IP picked when it opened, terminating or not, and each request
// on it restarts that pod's drain: Go's queue-proxy serves such a
// connection until the kubelet kills the pod (at the revision's timeout,
// 90 s here), cutting whatever request is then in flight; qproxy closes it once
// its drain has lasted a quiet period. Which connections land where is the
// cluster IP's choice; the counts say what the clients saw.
func TestScaleDownUnderLoad(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:    "scale-down",
		image:   image("helloworld"),
		timeout: 90,
		annotations: map[string]string{
			"autoscaling.knative.dev/initial-scale":         "5",
			"autoscaling.knative.dev/min-scale":             "1",
			"autoscaling.knative.dev/window":                "6s",
			"autoscaling.knative.dev/scale-down-delay":      "20s",
			"autoscaling.knative.dev/target-burst-capacity": "0",
		},
	})
	// The load starts once the ingress reaches the pods themselves, not
	// the activator.
	eventually(t, "the activator out of the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})
	c := newCounts()
	stop := make(chan struct{})
	load := loadHTTP(svc.name, 4, c, stop)
	start := time.Now()
	eventually(t, "one pod left, the others gone", 5*time.Minute, func() (bool, error) {
		return allPods(t, svc.revision) == 1, nil
	})
	gone := time.Since(start)
	t.Logf("one pod left after %s", gone.Round(time.Second))
	c.set("others-gone-after-s", int(gone.Seconds()))
	close(stop)
	load.Wait()
	c.record(t)
}

// The app's process is killed (SIGKILL) under a load, and restarted by the
// kubelet.
func TestAppCrashUnderLoad(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:  "crash",
		image: image("helloworld"),
		annotations: map[string]string{
			"autoscaling.knative.dev/min-scale":             "1",
			"autoscaling.knative.dev/max-scale":             "1",
			"autoscaling.knative.dev/target-burst-capacity": "0",
		},
	})
	victims := pods(t, svc.revision)
	if len(victims) != 1 {
		t.Fatalf("want one pod, have %d", len(victims))
	}
	pod := victims[0]
	c := newCounts()
	stop := make(chan struct{})
	load := loadHTTP(svc.name, 4, c, stop)
	eventually(t, "the load answered", time.Minute, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.n["http.get"] > 20, nil
	})
	container := userContainerID(t, pod.Name)
	appAddr := net.JoinHostPort(pod.Status.PodIP, "8080")
	killed := time.Now()
	killContainer(t, container)
	// When the app listens again, seen from outside the pod, the proxy
	// aside.
	var listening time.Time
	for down, deadline := false, killed.Add(5*time.Minute); listening.IsZero(); {
		conn, err := net.DialTimeout("tcp", appAddr, time.Second)
		switch {
		case err != nil:
			down = true
		case down:
			listening = time.Now()
		}
		if conn != nil {
			conn.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app did not go down and listen again within 5m (last: %v)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, "the app restarted and the pod Ready again", 5*time.Minute, func() (bool, error) {
		got, err := kube.CoreV1().Pods(namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		restarted := false
		for _, s := range got.Status.ContainerStatuses {
			if s.Name == "user-container" && s.RestartCount > 0 && s.Ready {
				restarted = true
			}
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == "Ready" && cond.Status != "True" {
				return false, nil
			}
		}
		return restarted, nil
	})
	// Answered again after the restart.
	before := c.snapshot("http.get")
	eventually(t, "the load answered after the restart", 2*time.Minute, func() (bool, error) {
		return c.snapshot("http.get") > before+20, nil
	})
	close(stop)
	load.Wait()
	first, last := c.failureWindow(killed)
	t.Logf("the app listened again %s after the kill; failures from %s to %s after it, %d of them once the app listened",
		listening.Sub(killed).Round(time.Millisecond), first.Round(time.Millisecond),
		last.Round(time.Millisecond), c.failedSince(listening))
	c.record(t)
}

func (c *counts) snapshot(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// userContainerID is the containerd id of the pod's app container.
func userContainerID(t *testing.T, pod string) string {
	t.Helper()
	got, err := kube.CoreV1().Pods(namespace).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading pod %s: %v", pod, err)
	}
	for _, s := range got.Status.ContainerStatuses {
		if s.Name == "user-container" {
			_, id, _ := strings.Cut(s.ContainerID, "://")
			return id
		}
	}
	t.Fatalf("pod %s has no user-container", pod)
	return ""
}

// killContainer kills the processes of the container `id` with SIGKILL:
// those whose cgroup names it (the node runs on this machine).
func killContainer(t *testing.T, id string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	killed := 0
	for _, f := range procs {
		raw, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(raw), id) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &pid); err == nil {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	if killed == 0 {
		t.Fatalf("no process of container %s to kill", id)
	}
}
