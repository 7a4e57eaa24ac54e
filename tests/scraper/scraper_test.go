// Package scraper checks qproxy's autoscaler stats with Knative's own
// scraper: the code Knative's autoscaler runs against every queue-proxy.
//
// It starts a slow app and qproxy (the binary named by QPROXY_BIN), holds
// five requests in flight (two of them marked as coming through the
// activator), and scrapes qproxy's :9090 with knative.dev/serving v0.42.2's
// pkg/autoscaler/metrics, as the autoscaler does for a pod at 127.0.0.1.
package scraper

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	netcfg "knative.dev/networking/pkg/config"
	"knative.dev/serving/pkg/apis/autoscaling/v1alpha1"
	"knative.dev/serving/pkg/apis/serving"
	"knative.dev/serving/pkg/autoscaler/metrics"
	"knative.dev/serving/pkg/resources"
)

const (
	namespace = "default"
	revision  = "hello-00001"
	pod       = "hello-00001-deployment-abc"
	deadline  = 20 * time.Second
)

// freePort asks the kernel for a free loopback port.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// podAccessor sees one running, ready pod at 127.0.0.1 of the revision.
func podAccessor() resources.PodAccessor {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
	})
	start := metav1.NewTime(time.Now().Add(-time.Hour))
	indexer.Add(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      pod,
			Namespace: namespace,
			Labels:    map[string]string{serving.RevisionLabelKey: revision},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      "127.0.0.1",
			StartTime:  &start,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	})
	return resources.NewPodAccessor(corev1listers.NewPodLister(indexer), namespace, revision)
}

// knativeEnv is the environment a default install of classic Knative gives
// a revision's sidecar (crates/core/knative-env.json, which qproxy's own
// tests read too), with overrides, as a process environment.
func knativeEnv(t *testing.T, overrides map[string]string) []string {
	raw, err := os.ReadFile("../../crates/core/knative-env.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Common  map[string]string `json:"common"`
		Classic map[string]string `json:"classic"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, set := range []map[string]string{file.Common, file.Classic, overrides} {
		for k, v := range set {
			vars[k] = v
		}
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

func TestKnativeScraperReadsQProxyStats(t *testing.T) {
	bin := os.Getenv("QPROXY_BIN")
	if bin == "" {
		t.Fatal("QPROXY_BIN must name the qproxy binary")
	}

	// The app holds every request until release is closed.
	var inFlight sync.WaitGroup
	inFlight.Add(5)
	release := make(chan struct{})
	appPort := freePort(t)
	app := &http.Server{
		Addr: "127.0.0.1:" + strconv.Itoa(appPort),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inFlight.Done()
			<-release
			io.WriteString(w, "done")
		}),
	}
	go app.ListenAndServe()
	defer app.Close()

	// The scraper always asks port 9090: it must be qproxy's.
	if c, err := net.Dial("tcp", "127.0.0.1:9090"); err == nil {
		c.Close()
		t.Fatal("port 9090 is in use by another process")
	}

	mainPort := freePort(t)
	qp := exec.Command(bin)
	qp.Env = knativeEnv(t, map[string]string{
		"SERVING_NAMESPACE":      namespace,
		"SERVING_REVISION":       revision,
		"SERVING_POD":            pod,
		"QUEUE_SERVING_PORT":     strconv.Itoa(mainPort),
		"QUEUE_SERVING_TLS_PORT": "0",
		"USER_PORT":              strconv.Itoa(appPort),
		// The scraper always asks port 9090 of the pod's IP.
		"QPROXY_STATS_PORT":   "9090",
		"QPROXY_ADMIN_PORT":   "0",
		"QPROXY_METRICS_PORT": "0",
	})
	qp.Stderr = os.Stderr
	if err := qp.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		qp.Process.Kill()
		qp.Wait()
	}()

	target := "http://127.0.0.1:" + strconv.Itoa(mainPort) + "/"
	waitFor(t, "qproxy listening", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:9090")
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// Five requests held at the app, two through the activator.
	var clients sync.WaitGroup
	for i := 0; i < 5; i++ {
		clients.Add(1)
		go func(proxied bool) {
			defer clients.Done()
			req, _ := http.NewRequest(http.MethodGet, target, nil)
			if proxied {
				req.Header.Set("K-Proxy-Request", "activator")
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}(i < 2)
	}
	inFlight.Wait()

	metric := &v1alpha1.Metric{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      revision,
			Labels: map[string]string{
				serving.ConfigurationLabelKey: "hello",
				serving.ServiceLabelKey:       "hello",
			},
		},
		Spec: v1alpha1.MetricSpec{ScrapeTarget: revision + "-private"},
	}
	scraper := metrics.NewStatsScraper(metric, revision, podAccessor(), false,
		netcfg.MeshCompatibilityModeDisabled, zap.NewNop().Sugar())

	// A whole reporting period with all five in flight reads 5, 2 of
	// them proxied.
	var stat metrics.Stat
	waitFor(t, "a scrape at concurrency 5", func() bool {
		s, err := scraper.Scrape(time.Minute)
		if err != nil {
			t.Logf("scrape: %v", err)
			return false
		}
		stat = s
		return s.AverageConcurrentRequests == 5
	})
	if stat.AverageProxiedConcurrentRequests != 2 {
		t.Errorf("proxied concurrency %v, want 2 (stat %+v)", stat.AverageProxiedConcurrentRequests, stat)
	}

	// The pod's own stat, decoded with Knative's message, names the pod.
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:9090/metrics", nil)
	req.Header.Set("Accept", "application/protobuf")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "application/protobuf" {
		t.Errorf("content type %q", ct)
	}
	var own metrics.Stat
	if err := own.Unmarshal(bytes.Clone(body)); err != nil {
		t.Fatal(err)
	}
	if own.PodName != pod {
		t.Errorf("pod name %q, want %q", own.PodName, pod)
	}
	if own.ProcessUptime <= 0 || own.Timestamp != 0 {
		t.Errorf("uptime %v, timestamp %v: want > 0 and 0", own.ProcessUptime, own.Timestamp)
	}

	close(release)
	clients.Wait()
}

// waitFor polls cond until it holds, failing the test after the deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
