package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// repo is the repository's root: the tests run from tests/cluster.
func repo(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "knative-overlay")); err != nil {
		t.Fatalf("run the cluster tests from tests/cluster: %v", err)
	}
	return root
}

// apply runs kubectl apply with args, failing the test with its output.
func apply(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig, "apply"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// relative is `target` as a path from `from`, as kustomize wants a
// component outside the kustomization's folder.
func relative(t testing.TB, from, target string) string {
	t.Helper()
	rel, err := filepath.Rel(from, target)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func write(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The overlay's base, as an operator applies it over Knative's release:
// every revision, new and running, moves to the image its patch names, and
// applying the release's serving-core.yaml again moves them all back.
//
// Not parallel: it changes the queue-proxy of the whole cluster, and puts
// back the one the tests started with before the parallel tests run.
func TestOverlayBaseSwitchesEveryRevisionAndBack(t *testing.T) {
	if servingCore == "" {
		t.Fatal("QPROXY_CLUSTER_SERVING_CORE (the release's serving-core.yaml) is not set; run the tests with tests/cluster/run")
	}
	qproxyImage := os.Getenv("QPROXY_CLUSTER_QPROXY_IMAGE")
	goImage := os.Getenv("QPROXY_CLUSTER_GO_IMAGE")
	if qproxyImage == "" || goImage == "" {
		t.Fatal("QPROXY_CLUSTER_QPROXY_IMAGE and QPROXY_CLUSTER_GO_IMAGE are not set; run the tests with tests/cluster/run")
	}
	root := repo(t)

	// knative-overlay/base as it is, but for two things an operator
	// changes too: the release's serving-core.yaml (the cluster's, not the
	// one it downloads) and the image its patch names (qproxy's here).
	dir := t.TempDir()
	base := filepath.Join(root, "knative-overlay", "base")
	core, err := os.ReadFile(servingCore)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "serving-core.yaml"), string(core))
	kustomization, err := os.ReadFile(filepath.Join(base, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	url := regexp.MustCompile(`(?m)^\s*- (https://\S+/serving-core\.yaml)$`).FindAllSubmatch(kustomization, -1)
	if len(url) != 1 {
		t.Fatalf("knative-overlay/base/kustomization.yaml: want one serving-core.yaml URL among its resources, found %d", len(url))
	}
	write(t, filepath.Join(dir, "kustomization.yaml"), string(bytes.Replace(kustomization, url[0][1], []byte("serving-core.yaml"), 1)))
	patch, err := os.ReadFile(filepath.Join(base, "queue-sidecar-image.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "registry.example.com/qproxy:0.1.0"
	if !bytes.Contains(patch, []byte(placeholder)) {
		t.Fatalf("knative-overlay/base/queue-sidecar-image.yaml no longer names %s", placeholder)
	}
	write(t, filepath.Join(dir, "queue-sidecar-image.yaml"), strings.Replace(string(patch), placeholder, qproxyImage, 1))

	restore := func() {
		if queueImage == goImage {
			apply(t, "-f", servingCore)
		} else {
			apply(t, "-k", dir)
		}
		waitImage(t, "", queueImage)
	}
	t.Cleanup(restore)

	// The release as shipped: Knative's own queue-proxy.
	apply(t, "-f", servingCore)
	waitImage(t, "", goImage)
	svc := create(t, service{
		name:        "overlay",
		image:       image("helloworld"),
		annotations: map[string]string{"autoscaling.knative.dev/min-scale": "1"},
	})
	waitImage(t, svc.revision, goImage)

	// The overlay: the running revision's pods are replaced, and a new
	// revision starts, with qproxy.
	apply(t, "-k", dir)
	waitImage(t, svc.revision, qproxyImage)
	c := client(ingress, 30*time.Second)
	if status, body, err := get(c, svc.name, "/"); err != nil || status != 200 || !strings.Contains(body, "Hello World") {
		t.Fatalf("GET / on qproxy after the overlay: %d %q %v", status, body, err)
	}

	// The rollback: the release's serving-core.yaml again.
	apply(t, "-f", servingCore)
	waitImage(t, svc.revision, goImage)
	if status, body, err := get(c, svc.name, "/"); err != nil || status != 200 || !strings.Contains(body, "Hello World") {
		t.Fatalf("GET / after the rollback: %d %q %v", status, body, err)
	}
}

// waitImage waits until config-deployment names `image` and, when
// revision is set, until every pod of the revision runs it as its
// queue-proxy and is Ready.
func waitImage(t *testing.T, revision, image string) {
	t.Helper()
	eventually(t, "config-deployment naming "+image, 2*time.Minute, func() (bool, error) {
		cm, err := kube.CoreV1().ConfigMaps("knative-serving").Get(context.Background(), "config-deployment", metav1.GetOptions{})
		return err == nil && cm.Data["queue-sidecar-image"] == image, err
	})
	if revision == "" {
		return
	}
	eventually(t, "every pod of "+revision+" on "+image, 4*time.Minute, func() (bool, error) {
		if n := allPods(t, revision); n != 1 {
			return false, fmt.Errorf("%d pods (one being replaced)", n)
		}
		for _, pod := range pods(t, revision) {
			if queueProxy(t, pod).Image != image {
				return false, nil
			}
			for _, c := range pod.Status.ContainerStatuses {
				if !c.Ready {
					return false, nil
				}
			}
		}
		return true, nil
	})
}

// The activator-bypass component: a Service it patches is served by its
// pods directly (its ServerlessService in Serve mode, its public endpoints
// the pods'), and requests under load never reach the activator.
func TestActivatorBypassComponentKeepsTheActivatorOut(t *testing.T) {
	t.Parallel()
	root := repo(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "service.yaml"), fmt.Sprintf(`apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: bypass
  namespace: %s
spec:
  template:
    spec:
      containers:
        - image: %s
`, namespace, image("helloworld")))
	write(t, filepath.Join(dir, "activator-bypass.yaml"), `apiVersion: v1
kind: ConfigMap
metadata:
  name: activator-bypass
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  min-scale: "1"
`)
	write(t, filepath.Join(dir, "kustomization.yaml"), fmt.Sprintf(
		"resources:\n  - service.yaml\n  - activator-bypass.yaml\ncomponents:\n  - %s\n",
		relative(t, dir, filepath.Join(root, "knative-overlay", "components", "activator-bypass"))))
	apply(t, "-k", dir)
	t.Cleanup(func() {
		_ = serving.ServingV1().Services(namespace).Delete(context.Background(), "bypass", metav1.DeleteOptions{})
	})
	svc := waitReady(t, "bypass")

	eventually(t, "the ServerlessService in Serve mode", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})
	eventually(t, "the revision's endpoints being its pod's", 2*time.Minute, func() (bool, error) {
		ready := pods(t, svc.revision)
		if len(ready) != 1 || ready[0].Status.PodIP == "" {
			return false, nil
		}
		eps, err := kube.CoreV1().Endpoints(namespace).Get(context.Background(), svc.revision, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, subset := range eps.Subsets {
			for _, a := range subset.Addresses {
				if a.IP != ready[0].Status.PodIP {
					return false, fmt.Errorf("endpoint %s is not the pod (%s)", a.IP, ready[0].Status.PodIP)
				}
			}
		}
		return len(eps.Subsets) > 0, nil
	})

	// A control: a Service with the activator always in its path, whose
	// requests the activator must be seen to count.
	control := create(t, service{name: "bypass-control", image: image("helloworld"), annotations: activatorAlways})
	eventually(t, "the activator in the control's path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, control.revision) == netv1alpha1.SKSOperationModeProxy, nil
	})

	before := activatorRequests(t, svc.revision)
	controlBefore := activatorRequests(t, control.revision)
	c := client(ingress, time.Minute)
	const n = 200
	outs := concurrently(n, func(int) (int, string, error) { return get(c, svc.name, "/") })
	for _, o := range outs {
		if o.err != nil || o.status != 200 {
			t.Fatalf("%d requests: %s", n, summary(outs))
		}
	}
	// Requests to the control after the load: once the activator shows
	// them, it has counted whatever it proxied before them.
	for i := 0; i < 5; i++ {
		if status, body, err := get(c, control.name, "/"); err != nil || status != 200 {
			t.Fatalf("GET / on the control: %d %q %v", status, body, err)
		}
	}
	eventually(t, "the activator counting the control's 5 requests", time.Minute, func() (bool, error) {
		return activatorRequests(t, control.revision)-controlBefore >= 5, nil
	})
	if after := activatorRequests(t, svc.revision); after != before {
		t.Fatalf("the activator counted %v requests for %s during the load (%v before, %v after)", after-before, svc.revision, before, after)
	}
}

// activatorRequests is the number of requests the activator has proxied to
// `revision`, from its Prometheus metrics: classic Knative's
// activator_request_count, current Knative's HTTP server durations. A
// revision it has proxied nothing to has no series: 0. The tests that read
// it check, on a revision the activator serves, that it counts.
func activatorRequests(t testing.TB, revision string) float64 {
	t.Helper()
	list, err := kube.CoreV1().Pods("knative-serving").List(context.Background(), metav1.ListOptions{LabelSelector: "app=activator"})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("finding the activator: %v", err)
	}
	var total float64
	for _, pod := range list.Items {
		req, err := http.NewRequest(http.MethodGet, "http://activator/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Close = true
		resp, err := client(pod.Status.PodIP+":9090", 10*time.Second).Do(req)
		if err != nil {
			t.Fatalf("reading the activator's metrics: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			name, _, _ := strings.Cut(line, "{")
			if name != "activator_request_count" && name != "http_server_request_duration_seconds_count" {
				continue
			}
			if !strings.Contains(line, `revision_name="`+revision+`"`) {
				continue
			}
			var v float64
			fields := strings.Fields(line)
			if _, err := fmt.Sscan(fields[len(fields)-1], &v); err == nil {
				total += v
			}
		}
	}
	return total
}

// The path-routing component for the Gateway API: two Knative Services
// behind one host, each reached by its path prefix through Traefik's
// Gateway, the prefix stripped and the Host set to the one Knative routes.
func TestPathRoutingComponentRoutesByPrefix(t *testing.T) {
	t.Parallel()
	root := repo(t)
	search := create(t, service{name: "search", image: image("runtime")})
	login := create(t, service{name: "login", image: image("helloworld")})

	dir := t.TempDir()
	apply(t, "-f", writeGateway(t, dir))
	conf := filepath.Join(dir, "apps.conf")
	write(t, conf, fmt.Sprintf(`host     apps.example.com
gateway  %[1]s/public
ingress  traefik/traefik-local:80
domain   svc.cluster.local
app %[2]s %[1]s /search
app %[3]s %[1]s /login
`, namespace, search.name, login.name))
	out, err := exec.Command("python3", filepath.Join(root, "knative-overlay", "components", "path-routing", "generate.py"),
		conf, "--out", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("generate.py: %v\n%s", err, out)
	}
	apply(t, "-k", filepath.Join(dir, "gateway-api"))
	t.Cleanup(func() {
		_ = exec.Command(kubectl, "--kubeconfig", kubeconfig, "delete", "-k", filepath.Join(dir, "gateway-api")).Run()
	})

	c := client(ingress, 30*time.Second)
	shared := func(path string) (int, string, error) {
		resp, err := c.Get("http://apps.example.com" + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	var info struct {
		Request struct {
			URI  string `json:"uri"`
			Host string `json:"host"`
		} `json:"request"`
	}
	eventually(t, "/search/x?q=1 on the shared host reaching search as /x?q=1", 2*time.Minute, func() (bool, error) {
		status, body, err := shared("/search/x?q=1")
		if err != nil || status != 200 {
			return false, fmt.Errorf("%d %v %.200s", status, err, body)
		}
		if err := json.Unmarshal([]byte(body), &info); err != nil {
			return false, err
		}
		return info.Request.URI == "/x?q=1" &&
			info.Request.Host == fmt.Sprintf("%s.%s.svc.cluster.local", search.name, namespace), nil
	})
	status, body, err := shared("/login")
	if err != nil || status != 200 || !strings.Contains(body, "Hello World") {
		t.Fatalf("/login on the shared host: %d %q %v", status, body, err)
	}
	if status, _, err := shared("/searching"); err != nil || status != 404 {
		t.Fatalf("/searching is no app's prefix: %d %v, want 404", status, err)
	}
}

// writeGateway writes the Gateway the routes attach to: Traefik's class, a
// listener on its `web` entry point (port 8080), routes from this
// namespace.
func writeGateway(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "gateway.yaml")
	write(t, path, fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: public
  namespace: %s
spec:
  gatewayClassName: traefik
  listeners:
    - name: http
      protocol: HTTP
      port: 8080
      allowedRoutes:
        namespaces:
          from: Same
`, namespace))
	return path
}
