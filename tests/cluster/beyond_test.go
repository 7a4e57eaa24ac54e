package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// isQProxy says whether the tests run with qproxy as the queue-proxy (not
// Knative's own).
func isQProxy() bool {
	return strings.Contains(queueImage, "qproxy")
}

// setConfig sets keys of a ConfigMap of knative-serving, and puts back
// what they were when the test ends.
func setConfig(t *testing.T, name string, keys map[string]string) {
	t.Helper()
	ctx := context.Background()
	maps := kube.CoreV1().ConfigMaps("knative-serving")
	cm, err := maps.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	patch := func(data map[string]*string) {
		body, err := json.Marshal(map[string]any{"data": data})
		if err != nil {
			t.Fatalf("patch of %s: %v", name, err)
		}
		if _, err := maps.Patch(context.Background(), name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			t.Fatalf("patching %s: %v", name, err)
		}
	}
	set, back := map[string]*string{}, map[string]*string{}
	for k, v := range keys {
		set[k] = &v
		if old, ok := cm.Data[k]; ok {
			back[k] = &old
		} else {
			back[k] = nil
		}
	}
	patch(set)
	t.Cleanup(func() { patch(back) })
}

// userMetrics is the text of a pod's user metrics port (9091).
func userMetrics(t testing.TB, revision string) (string, error) {
	t.Helper()
	live := pods(t, revision)
	if len(live) != 1 || live[0].Status.PodIP == "" {
		return "", fmt.Errorf("want one pod with an address, have %d", len(live))
	}
	resp, err := client(live[0].Status.PodIP+":9091", 5*time.Second).Get("http://metrics/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("9091: %d %v", resp.StatusCode, err)
	}
	return string(body), nil
}

// series is whether the metrics text has a sample of `name` (with any
// labels) whose value satisfies ok.
func series(text, name string, ok func(value string) bool) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") {
			fields := strings.Fields(line)
			if ok(fields[len(fields)-1]) {
				return true
			}
		}
	}
	return false
}

func anyValue(string) bool { return true }

// qproxy's additions (docs/options.md) as an operator asks for them:
// config-features lets the pod's annotations be mounted for the
// queue-proxy, and the Service's template annotates its revision with
// qproxy's options. With qproxy, the pod serves the start-up spans and the
// adaptive limit on 9091, and a WebSocket outlives the revision's 4 s
// timeout; with Knative's own queue-proxy the same Service serves, with
// none of them, and the WebSocket is cut at the timeout, as Knative cuts
// it.
func TestAdditionsAskedForByAnnotation(t *testing.T) {
	t.Parallel()
	setConfig(t, "config-features", map[string]string{"queueproxy.mount-podinfo": "allowed"})
	// Current Knative serves 9091 when its request metrics are
	// Prometheus'; classic Knative serves it by default.
	setConfig(t, "config-observability", map[string]string{"request-metrics-protocol": "prometheus"})
	svc := create(t, service{
		name:    "additions",
		image:   image("wsserver"),
		timeout: 4,
		annotations: map[string]string{
			"autoscaling.knative.dev/min-scale":                     "1",
			"autoscaling.knative.dev/target-burst-capacity":         "0",
			"features.knative.dev/queueproxy-podinfo":               "enabled",
			"qpoption.knative.dev/qproxy-upgrades-outlive-timeouts": "on",
			"qpextension.knative.dev/qproxy-adaptive-concurrency":   "on",
		},
	})
	eventually(t, "the activator out of the path", 2*time.Minute, func() (bool, error) {
		return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
	})

	// Before any request: the app's readiness span, and the adaptive limit
	// pinned at the probe's 3.
	var text string
	eventually(t, "the pod's user metrics", time.Minute, func() (bool, error) {
		var err error
		text, err = userMetrics(t, svc.revision)
		return err == nil, err
	})
	if isQProxy() {
		eventually(t, "the start-up span and the limit on 9091", time.Minute, func() (bool, error) {
			text, err := userMetrics(t, svc.revision)
			return series(text, "qproxy_startup_app_ready_seconds", anyValue) &&
				series(text, "qproxy_adaptive_concurrency_limit", func(v string) bool { return v == "3" }), err
		})
	} else if strings.Contains(text, "qproxy_") {
		t.Fatalf("Knative's queue-proxy serving qproxy's series:\n%s", text)
	}

	// A WebSocket through the ingress, echoing once a second for eight
	// seconds: twice the revision's timeout.
	conn := dialWebSocket(t, svc.name)
	defer conn.Close()
	start := time.Now()
	var cut error
	for i := 0; i < 8 && cut == nil; i++ {
		message := fmt.Sprintf("message %d", i)
		if err := conn.WriteMessage(websocket.TextMessage, []byte(message)); err != nil {
			cut = err
			break
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		kind, got, err := conn.ReadMessage()
		if err != nil {
			cut = err
			break
		}
		if kind != websocket.TextMessage || string(got) != message {
			t.Fatalf("echo of %q: %q (type %d)", message, got, kind)
		}
		// The scenario is time passing: a socket living past the timeout.
		time.Sleep(time.Second)
	}
	lived := time.Since(start).Round(100 * time.Millisecond)
	if isQProxy() && cut != nil {
		t.Fatalf("the WebSocket was cut after %s with the option on: %v", lived, cut)
	}
	if !isQProxy() && cut == nil {
		t.Fatalf("Knative's queue-proxy kept the WebSocket %s, past its 4 s timeout", lived)
	}
	t.Logf("the WebSocket lived %s (cut: %v)", lived, cut)
	conn.Close()

	// Requests until the limit's probe has its 50: plain GETs, which the
	// app refuses (it only upgrades), ten at a time. A window of the
	// limit closes with a request that finishes after it, so the probe
	// ends with traffic, not with time.
	c := client(ingress, time.Minute)
	sent := 0
	eventually(t, "the first request's span and the unloaded latency on 9091", 2*time.Minute, func() (bool, error) {
		for i := 0; i < 10; i++ {
			sent++
			if status, body, err := get(c, svc.name, "/"); err != nil || status != http.StatusBadRequest {
				t.Fatalf("request %d: %d %q %v", sent, status, body, err)
			}
		}
		if !isQProxy() {
			return sent >= 60, nil
		}
		text, err := userMetrics(t, svc.revision)
		return series(text, "qproxy_startup_first_request_seconds", anyValue) &&
			series(text, "qproxy_adaptive_concurrency_unloaded_seconds", anyValue), err
	})
	t.Logf("the probe was over after %d requests", sent)
}
