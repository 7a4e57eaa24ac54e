package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/pkg/ptr"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	"knative.dev/serving/pkg/autoscaler/metrics"
)

// service describes a Knative Service for a test: one container of one
// of Knative's test images, and the revision's annotations and settings.
type service struct {
	name        string
	image       string
	annotations map[string]string
	concurrency int64 // containerConcurrency; 0 for Knative's default
	timeout     int64 // timeoutSeconds; 0 for Knative's default
	port        *corev1.ContainerPort
	env         []corev1.EnvVar
}

// ready is a Knative Service that has become Ready, and its revision.
type ready struct {
	name     string
	revision string
}

// create makes the Service, removes it when the test ends, and waits until
// Knative calls it Ready.
func create(t *testing.T, s service) ready {
	t.Helper()
	ctx := context.Background()
	container := corev1.Container{Image: s.image, Env: s.env}
	if s.port != nil {
		container.Ports = []corev1.ContainerPort{*s.port}
	}
	spec := v1.RevisionSpec{PodSpec: corev1.PodSpec{Containers: []corev1.Container{container}}}
	if s.concurrency > 0 {
		spec.ContainerConcurrency = ptr.Int64(s.concurrency)
	}
	if s.timeout > 0 {
		spec.TimeoutSeconds = ptr.Int64(s.timeout)
	}
	ksvc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: namespace},
		Spec: v1.ServiceSpec{ConfigurationSpec: v1.ConfigurationSpec{Template: v1.RevisionTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: s.annotations},
			Spec:       spec,
		}}},
	}
	services := serving.ServingV1().Services(namespace)
	if _, err := services.Create(ctx, ksvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Service %s: %v", s.name, err)
	}
	t.Cleanup(func() {
		_ = services.Delete(context.Background(), s.name, metav1.DeleteOptions{})
	})
	return waitReady(t, s.name)
}

// waitReady waits until the Knative Service `name` is Ready at its latest
// generation, and returns it with its revision.
func waitReady(t *testing.T, name string) ready {
	t.Helper()
	var revision string
	eventually(t, "Service "+name+" Ready", 4*time.Minute, func() (bool, error) {
		got, err := serving.ServingV1().Services(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got.Status.ObservedGeneration != got.Generation || !got.IsReady() {
			if c := got.Status.GetCondition("Ready"); c != nil && c.Message != "" {
				return false, fmt.Errorf("%s: %s", c.Reason, c.Message)
			}
			return false, nil
		}
		revision = got.Status.LatestReadyRevisionName
		return revision != "", nil
	})
	return ready{name: name, revision: revision}
}

// pods are the revision's pods that are not being deleted.
func pods(t testing.TB, revision string) []corev1.Pod {
	t.Helper()
	list, err := kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "serving.knative.dev/revision=" + revision,
	})
	if err != nil {
		t.Fatalf("listing pods of %s: %v", revision, err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// allPods are the revision's pods, those being deleted included.
func allPods(t testing.TB, revision string) int {
	t.Helper()
	list, err := kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "serving.knative.dev/revision=" + revision,
	})
	if err != nil {
		t.Fatalf("listing pods of %s: %v", revision, err)
	}
	return len(list.Items)
}

// sksMode is the revision's ServerlessService mode: Proxy when the
// activator is in the path, Serve when it is not.
func sksMode(t testing.TB, revision string) netv1alpha1.ServerlessServiceOperationMode {
	t.Helper()
	sks, err := networking.NetworkingV1alpha1().ServerlessServices(namespace).Get(context.Background(), revision, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the ServerlessService of %s: %v", revision, err)
	}
	return sks.Spec.Mode
}

// queueProxy is the pod's queue-proxy container, failing the test if
// Knative did not inject one.
func queueProxy(t testing.TB, pod corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		if c.Name == "queue-proxy" {
			return c
		}
	}
	t.Fatalf("pod %s has no queue-proxy container", pod.Name)
	return corev1.Container{}
}

// get sends GET path to the Service through the ingress and returns the
// status and body.
func get(c *http.Client, name, path string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+host(name)+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// outcome is what one request of a batch got.
type outcome struct {
	status int
	body   string
	err    error
}

// concurrently sends n requests at once and returns what each got.
func concurrently(n int, send func(i int) (int, string, error)) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			status, body, err := send(i)
			out[i] = outcome{status, body, err}
		}(i)
	}
	wg.Wait()
	return out
}

// summary counts outcomes by status (errors by their text), for messages.
func summary(outs []outcome) string {
	counts := map[string]int{}
	for _, o := range outs {
		key := fmt.Sprint(o.status)
		if o.err != nil {
			key = o.err.Error()
		}
		counts[key]++
	}
	var parts []string
	for k, v := range counts {
		parts = append(parts, fmt.Sprintf("%d× %s", v, k))
	}
	return strings.Join(parts, ", ")
}

// namedPort is a container port with a name, for h2c apps.
func namedPort(name string, port int32) *corev1.ContainerPort {
	return &corev1.ContainerPort{Name: name, ContainerPort: port}
}

// inFlight is the pod's concurrency as its queue-proxy reports it to the
// autoscaler (the Stat message on port 9090, averaged over the last
// second), or 0 when it cannot be read.
func inFlight(t testing.TB, pod corev1.Pod) float64 {
	t.Helper()
	fresh, err := kube.CoreV1().Pods(namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil || fresh.Status.PodIP == "" {
		return 0
	}
	req, err := http.NewRequest(http.MethodGet, "http://stats/metrics", nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Accept", "application/protobuf")
	req.Close = true
	resp, err := client(fresh.Status.PodIP+":9090", 5*time.Second).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0
	}
	var stat metrics.Stat
	if err := stat.Unmarshal(body); err != nil {
		t.Fatalf("the queue-proxy's Stat on 9090: %v", err)
	}
	return stat.AverageConcurrentRequests
}
