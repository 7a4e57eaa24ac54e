package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// A Knative Service becomes Ready with the configured queue-proxy injected
// by Knative's controller, the kubelet's readiness probe passing through it,
// and a request through the ingress answered by the app behind it.
func TestServiceReadyWithQueueProxyInjected(t *testing.T) {
	t.Parallel()
	svc := create(t, service{name: "ready", image: image("helloworld")})

	var found bool
	eventually(t, "a Ready pod of "+svc.revision, time.Minute, func() (bool, error) {
		for _, pod := range pods(t, svc.revision) {
			qp := queueProxy(t, pod)
			if qp.Image != queueImage {
				return false, fmt.Errorf("pod %s runs queue-proxy %s, not %s", pod.Name, qp.Image, queueImage)
			}
			if qp.ReadinessProbe == nil {
				t.Fatalf("pod %s: Knative gave the queue-proxy no readiness probe", pod.Name)
			}
			for _, status := range pod.Status.ContainerStatuses {
				if status.Name == "queue-proxy" && status.Ready {
					found = true
				}
			}
		}
		return found, nil
	})

	status, body, err := get(client(ingress, 30*time.Second), svc.name, "/")
	if err != nil || status != 200 || !strings.Contains(body, "Hello World") {
		t.Fatalf("GET / through the ingress: %d %q %v", status, body, err)
	}
}

// A revision scaled to zero is woken through the activator by a request.
func TestScaleFromZeroThroughTheActivator(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:        "from-zero",
		image:       image("autoscale"),
		annotations: map[string]string{"autoscaling.knative.dev/window": "6s"},
	})
	eventually(t, "scaled to zero", 4*time.Minute, func() (bool, error) {
		return allPods(t, svc.revision) == 0, nil
	})
	if mode := sksMode(t, svc.revision); mode != netv1alpha1.SKSOperationModeProxy {
		t.Fatalf("at zero the ServerlessService is in mode %s, not Proxy (the activator in the path)", mode)
	}
	status, body, err := get(client(ingress, 2*time.Minute), svc.name, "/?sleep=10")
	if err != nil || status != 200 {
		t.Fatalf("the first request, from zero: %d %q %v", status, body, err)
	}
	if n := len(pods(t, svc.revision)); n == 0 {
		t.Fatal("a request from zero was answered with no pod of the revision")
	}
}

// A revision scales up under load on the queue-proxy's own statistics (the
// activator is out of the path once pods exist, with a target burst
// capacity of 0), and back to zero when the load stops.
func TestScaleUpOnTheQueueProxysStatsAndBackToZero(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:  "scale",
		image: image("autoscale"),
		annotations: map[string]string{
			"autoscaling.knative.dev/window":                "6s",
			"autoscaling.knative.dev/target":                "1",
			"autoscaling.knative.dev/target-burst-capacity": "0",
			"autoscaling.knative.dev/max-scale":             "4",
		},
	})
	// With a pod up and no burst capacity asked for, the activator is out
	// of the path: only the queue-proxy reports the load.
	eventually(t, "the activator out of the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})
	c := client(ingress, 2*time.Minute)

	// Eight requests at a time, each 1 s at the app, against a target of
	// one request per pod: the autoscaler must want more pods.
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(halt) // a failed wait below stops the load too
	done := make(chan []outcome, 1)
	go func() {
		var all []outcome
		for {
			select {
			case <-stop:
				done <- all
				return
			default:
			}
			all = append(all, concurrently(8, func(int) (int, string, error) {
				return get(c, svc.name, "/?sleep=1000")
			})...)
		}
	}()
	eventually(t, "the autoscaler wanting more than one pod", 3*time.Minute, func() (bool, error) {
		pa, err := serving.AutoscalingV1alpha1().PodAutoscalers(namespace).Get(context.Background(), svc.revision, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pa.Status.DesiredScale != nil && *pa.Status.DesiredScale > 1, nil
	})
	eventually(t, "more than one pod", 3*time.Minute, func() (bool, error) {
		return len(pods(t, svc.revision)) > 1, nil
	})
	halt()
	outs := <-done
	for _, o := range outs {
		if o.err != nil || o.status != 200 {
			t.Fatalf("under load: %s", summary(outs))
		}
	}

	eventually(t, "back to zero once the load stopped", 5*time.Minute, func() (bool, error) {
		return allPods(t, svc.revision) == 0, nil
	})
}

// containerConcurrency 1 with the activator always in the path: every
// request is answered, and the app (which answers 500 to a request that
// overlaps another) never sees two at once.
func TestSingleConcurrencyThroughTheActivator(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:        "single",
		image:       image("singlethreaded"),
		concurrency: 1,
		annotations: map[string]string{
			"autoscaling.knative.dev/target-burst-capacity": "-1",
			"autoscaling.knative.dev/max-scale":             "1",
		},
	})
	eventually(t, "the activator in the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeProxy, nil
	})
	before := activatorRequests(t, svc.revision)
	c := client(ingress, 2*time.Minute)
	outs := concurrently(12, func(int) (int, string, error) { return get(c, svc.name, "/") })
	for _, o := range outs {
		if o.err != nil || o.status != 200 || o.body != "One at a time" {
			t.Fatalf("12 requests at once, one at a time at the app: %s", summary(outs))
		}
	}
	// The activator counted them: what the bypass test reads is the
	// activator's count of a revision's requests.
	eventually(t, "the activator counting the 12 requests", time.Minute, func() (bool, error) {
		return activatorRequests(t, svc.revision)-before >= 12, nil
	})
}

// The revision's timeout: an app that sends nothing for longer is answered
// 504 by the queue-proxy; one within it is answered by the app.
func TestRevisionTimeoutIs504(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:    "timeout",
		image:   image("timeout"),
		timeout: 3,
		annotations: map[string]string{
			"autoscaling.knative.dev/min-scale":             "1",
			"autoscaling.knative.dev/target-burst-capacity": "0",
		},
	})
	eventually(t, "the activator out of the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})
	c := client(ingress, time.Minute)
	status, body, err := get(c, svc.name, "/?initialTimeout=6000")
	if err != nil || status != 504 {
		t.Fatalf("an app silent past the 3 s timeout: %d %q %v, want 504", status, body, err)
	}
	status, body, err = get(c, svc.name, "/?initialTimeout=200&timeout=200")
	if err != nil || status != 200 || body != "Slept for 200 milliseconds" {
		t.Fatalf("an app within the timeout: %d %q %v", status, body, err)
	}
}

// A pod deleted with requests in flight finishes them: the queue-proxy
// drains before the app is stopped.
func TestPodDeletedWithRequestsInFlightLosesNone(t *testing.T) {
	t.Parallel()
	svc := create(t, service{
		name:  "drain",
		image: image("timeout"),
		annotations: map[string]string{
			"autoscaling.knative.dev/min-scale":             "1",
			"autoscaling.knative.dev/max-scale":             "1",
			"autoscaling.knative.dev/target-burst-capacity": "0",
		},
	})
	eventually(t, "the activator out of the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})
	victims := pods(t, svc.revision)
	if len(victims) != 1 {
		t.Fatalf("want one pod, have %d", len(victims))
	}
	c := client(ingress, 2*time.Minute)

	// Ten requests that each take 8 s at the app, then the pod deleted
	// while all ten are in it.
	const n = 10
	results := make(chan []outcome, 1)
	go func() {
		results <- concurrently(n, func(int) (int, string, error) {
			return get(c, svc.name, "/?timeout=8000")
		})
	}()
	eventually(t, "the ten requests at the app", time.Minute, func() (bool, error) {
		return inFlight(t, victims[0]) >= n, nil
	})
	if err := kube.CoreV1().Pods(namespace).Delete(context.Background(), victims[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s: %v", victims[0].Name, err)
	}
	outs := <-results
	for _, o := range outs {
		if o.err != nil || o.status != 200 || o.body != "Slept for 8000 milliseconds" {
			t.Fatalf("requests in flight when their pod was deleted: %s", summary(outs))
		}
	}
}
