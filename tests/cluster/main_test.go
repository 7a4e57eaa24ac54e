// Package cluster tests qproxy where it is meant to live: as the
// queue-proxy that Knative Serving's own controller injects into real pods,
// on the cluster scripts/cluster starts. The same tests run against
// Knative's own queue-proxy (tests/cluster/run switches between them), and
// must give the same outcome with both; the test of qproxy's additions
// (beyond_test.go) asserts each proxy's own.
//
// Every test talks to the cluster as a client would: Knative Services
// created through the API, requests through the ingress (Traefik) and the
// activator, pods deleted through the API. A pod is read only where the
// autoscaler reads it (its queue-proxy's statistics on port 9090) and, for
// qproxy's additions, where Prometheus reads it (9091).
package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	networkingclient "knative.dev/networking/pkg/client/clientset/versioned"
	servingclient "knative.dev/serving/pkg/client/clientset/versioned"
)

const (
	// namespace holds every object the tests make; it is made afresh and
	// removed at the end.
	namespace = "qproxy-cluster-tests"
	// The Knative domain scripts/cluster configures; nothing resolves it,
	// requests carry it as their Host.
	domain = "example.com"
)

var (
	kube       kubernetes.Interface
	serving    servingclient.Interface
	networking networkingclient.Interface
	kubectl    string
	kubeconfig string
	// ingress is Traefik's public entry (scripts/cluster fixes its address).
	ingress = envOr("QPROXY_CLUSTER_INGRESS", "10.96.0.80:80")
	// ingressLocal is its cluster-local entry.
	ingressLocal = envOr("QPROXY_CLUSTER_INGRESS_LOCAL", "10.96.0.81:80")
	// queueImage is the queue-proxy every new revision must run: what
	// config-deployment names when the tests start.
	queueImage string
	// servingCore is the release's serving-core.yaml scripts/cluster
	// installed (the overlay tests apply it).
	servingCore = os.Getenv("QPROXY_CLUSTER_SERVING_CORE")
)

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	kubeconfig = os.Getenv("KUBECONFIG")
	kubectl = envOr("QPROXY_CLUSTER_KUBECTL", "kubectl")
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cluster tests: KUBECONFIG is not set; run them with tests/cluster/run")
		return 2
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests:", err)
		return 2
	}
	config.QPS, config.Burst = 50, 100
	// Knative's webhook warns about every pod without a security context.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	kube = kubernetes.NewForConfigOrDie(config)
	serving = servingclient.NewForConfigOrDie(config)
	networking = networkingclient.NewForConfigOrDie(config)

	ctx := context.Background()
	cm, err := kube.CoreV1().ConfigMaps("knative-serving").Get(ctx, "config-deployment", metav1.GetOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests: reading config-deployment:", err)
		return 2
	}
	queueImage = cm.Data["queue-sidecar-image"]
	if want := os.Getenv("QPROXY_CLUSTER_QUEUE_IMAGE"); want != "" && want != queueImage {
		fmt.Fprintf(os.Stderr, "cluster tests: config-deployment names %s, not %s\n", queueImage, want)
		return 2
	}
	fmt.Fprintf(os.Stderr, "cluster tests: queue-proxy %s\n", queueImage)

	if err := freshNamespace(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests:", err)
		return 2
	}
	code := m.Run()
	// tests/cluster/run --keep keeps the namespace too, to look at.
	if os.Getenv("QPROXY_CLUSTER_KEEP") == "" {
		_ = kube.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	}
	return code
}

// freshNamespace removes what an earlier run left and makes the namespace.
func freshNamespace(ctx context.Context) error {
	ns := kube.CoreV1().Namespaces()
	_ = ns.Delete(ctx, namespace, metav1.DeleteOptions{})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := ns.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) || time.Now().After(deadline) {
			return fmt.Errorf("making namespace %s: %w", namespace, err)
		}
		time.Sleep(time.Second)
	}
}

// eventually polls cond until it returns true, failing the test with what
// was awaited (and cond's last error) after timeout.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				t.Fatalf("%s: not within %s (last error: %v)", what, timeout, last)
			}
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// client sends every request to addr, whatever its URL's host: the URL's
// host becomes the Host header the ingress routes by.
func client(addr string, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, addr)
			},
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
	}
}

// host is a Knative Service's public host name.
func host(name string) string {
	return fmt.Sprintf("%s.%s.%s", name, namespace, domain)
}

// image is one of Knative's test images, as scripts/cluster imported it.
func image(name string) string {
	return fmt.Sprintf("ko.local/%s:e2e", name)
}
