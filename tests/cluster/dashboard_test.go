package cluster

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// prometheus is the cluster's Prometheus (scripts/cluster fixes its
// address), scraping every revision's queue-proxy every scrapeInterval.
var prometheus = envOr("QPROXY_CLUSTER_PROMETHEUS", "10.96.0.90:9090")

const (
	scrapeInterval = 5 * time.Second
	// What the test gives Grafana's $__rate_interval: four scrapes.
	rateInterval = "20s"
)

// dashboard is the part of deploy/dashboards/qproxy-revision.json the test
// reads: each panel's title, kind and queries.
type dashboard struct {
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			RefID  string `json:"refId"`
			Expr   string `json:"expr"`
			Legend string `json:"legendFormat"`
		} `json:"targets"`
	} `json:"panels"`
}

// openLoad is what the clients of a fixed-rate load sent and saw.
type openLoad struct {
	Service  string         `json:"service"`
	Revision string         `json:"revision"`
	Path     string         `json:"path"`
	Rate     int            `json:"rate"`
	Seconds  int            `json:"seconds"`
	Sleep    float64        `json:"sleep"`
	CC       int            `json:"container_concurrency"`
	Sent     int            `json:"sent"`
	Status   map[string]int `json:"status"`
	Errors   int            `json:"errors"`
	Slowest  float64        `json:"slowest"`
	Start    float64        `json:"start"`
	End      float64        `json:"end"`
}

// perSecond is the load's rate of requests with the status `code` ("" for
// every request).
func (l *openLoad) perSecond(code string) float64 {
	n := l.Sent
	if code != "" {
		n = l.Status[code]
	}
	return float64(n) / (l.End - l.Start)
}

// run sends `rate` requests a second for `seconds`, each on its own, not
// waiting for the answers of earlier ones (a load that holds its rate
// whatever the latency), and waits for every answer.
func (l *openLoad) run(c *http.Client) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	l.Status = map[string]int{}
	tick := time.NewTicker(time.Second / time.Duration(l.Rate))
	defer tick.Stop()
	l.Start = now()
	for i := 0; i < l.Rate*l.Seconds; i++ {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			status, _, err := get(c, l.Service, l.Path)
			took := time.Since(began).Seconds()
			mu.Lock()
			defer mu.Unlock()
			l.Sent++
			if err != nil {
				l.Errors++
				return
			}
			l.Status[strconv.Itoa(status)]++
			l.Slowest = math.Max(l.Slowest, took)
		}()
	}
	wg.Wait()
	l.End = now()
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

var promClient = &http.Client{Timeout: 30 * time.Second}

// promSeries is one series of a query's answer: its labels and its
// samples (one for an instant query).
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Values []sample          `json:"values"`
}

// sample is a time and a value; written as JSON with a value that is not a
// number (a quantile of no requests) as null.
type sample [2]float64

func (s sample) MarshalJSON() ([]byte, error) {
	if math.IsNaN(s[1]) || math.IsInf(s[1], 0) {
		return json.Marshal([]any{s[0], nil})
	}
	return json.Marshal([]any{s[0], s[1]})
}

// query asks the cluster's Prometheus: an instant query at `at`, or a
// range query from `start` to `at` when step > 0.
func query(expr string, start, at float64, step time.Duration) ([]promSeries, error) {
	params := url.Values{"query": {expr}}
	path := "/api/v1/query"
	if step > 0 {
		path = "/api/v1/query_range"
		params.Set("start", strconv.FormatFloat(start, 'f', 3, 64))
		params.Set("end", strconv.FormatFloat(at, 'f', 3, 64))
		params.Set("step", step.String())
	} else {
		params.Set("time", strconv.FormatFloat(at, 'f', 3, 64))
	}
	resp, err := promClient.Get("http://" + prometheus + path + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
				Values [][]any           `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return nil, fmt.Errorf("%s: %d, %v", path, resp.StatusCode, err)
	}
	if answer.Status != "success" {
		return nil, fmt.Errorf("%s: %s", path, answer.Error)
	}
	var out []promSeries
	for _, r := range answer.Data.Result {
		samples := r.Values
		if step == 0 {
			samples = [][]any{r.Value}
		}
		s := promSeries{Metric: r.Metric}
		for _, got := range samples {
			if len(got) != 2 {
				return nil, fmt.Errorf("%s: a sample of %d fields", path, len(got))
			}
			t, _ := got[0].(float64)
			text, _ := got[1].(string)
			v, err := strconv.ParseFloat(text, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: sample %q: %v", path, text, err)
			}
			s.Values = append(s.Values, sample{t, v})
		}
		out = append(out, s)
	}
	return out, nil
}

// panelResult is what one panel's query gave for one revision.
type panelResult struct {
	Panel  string       `json:"panel"`
	Kind   string       `json:"kind"`
	Source string       `json:"source"`
	RefID  string       `json:"ref_id"`
	Legend string       `json:"legend"`
	Expr   string       `json:"expr"`
	Series []promSeries `json:"series"`
}

// values are every sample's value but NaN (a quantile of no requests).
func (r panelResult) values() []float64 {
	var out []float64
	for _, s := range r.Series {
		for _, v := range s.Values {
			if !math.IsNaN(v[1]) && !math.IsInf(v[1], 0) {
				out = append(out, v[1])
			}
		}
	}
	return out
}

func maxOf(vs []float64) float64 {
	m := math.Inf(-1)
	for _, v := range vs {
		m = math.Max(m, v)
	}
	return m
}

func minOf(vs []float64) float64 {
	m := math.Inf(1)
	for _, v := range vs {
		m = math.Min(m, v)
	}
	return m
}

// check says what of a panel's results would contradict the load: its
// queries' results (by refId) against what the clients sent and saw.
type check func(results map[string]panelResult, l *openLoad) error

// within fails when a value of the panel's `ref` is out of [lo, hi].
func within(rs map[string]panelResult, ref string, lo, hi float64) error {
	vs := rs[ref].values()
	if len(vs) == 0 {
		return nil
	}
	if mn, mx := minOf(vs), maxOf(vs); mn < lo || mx > hi {
		return fmt.Errorf("%s: values from %.4g to %.4g, outside [%.4g, %.4g]", ref, mn, mx, lo, hi)
	}
	return nil
}

// reaches fails when no value of `ref` is at least lo.
func reaches(rs map[string]panelResult, ref string, lo float64) error {
	if vs := rs[ref].values(); len(vs) > 0 && maxOf(vs) < lo {
		return fmt.Errorf("%s: at most %.4g, the load gives at least %.4g", ref, maxOf(vs), lo)
	}
	return nil
}

func all(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// The slack of a count against the clients': Prometheus extrapolates a
// counter's increase to the range's edges, and kubelet probes count where
// current Knative counts every request.
func countBound(n float64) float64 { return 1.25*n + 10 }

// checks are the panels' checks, by title: every panel has one, and a
// check without a panel fails too.
var checks = map[string]check{
	"Requests per second, by status code": func(rs map[string]panelResult, l *openLoad) error {
		return within(rs, "A", 0, 2*l.perSecond("")+2)
	},
	"Requests in the range, by status code": func(rs map[string]panelResult, l *openLoad) error {
		total := 0.0
		for _, s := range rs["A"].Series {
			code, n := s.Metric["code"], s.Values[0][1]
			total += n
			if n > countBound(float64(l.Status[code])) {
				return fmt.Errorf("%.0f requests answered %s, the clients saw %d", n, code, l.Status[code])
			}
		}
		if total > countBound(float64(l.Sent)) || total < 0.5*float64(l.Sent) {
			return fmt.Errorf("%.0f requests in all, the clients sent %d", total, l.Sent)
		}
		return nil
	},
	"Latency through the queue-proxy": func(rs map[string]panelResult, l *openLoad) error {
		hi := 2*l.Slowest + 1
		return all(within(rs, "A", 0, hi), within(rs, "B", 0, hi), within(rs, "C", 0, hi), reaches(rs, "C", l.Sleep/2))
	},
	"Latency of the app": func(rs map[string]panelResult, l *openLoad) error {
		// Every request the app answers sleeps l.Sleep.
		return all(within(rs, "A", l.Sleep/2, 2*l.Slowest+1), within(rs, "B", l.Sleep/2, 2*l.Slowest+1))
	},
	"Concurrency as the autoscaler sees it": func(rs map[string]panelResult, l *openLoad) error {
		// Never more in the queue-proxy than its slots and queue (ten a
		// slot, as Knative's breaker has it), or than the load holds.
		most := l.perSecond("") * l.Slowest
		if l.CC > 0 {
			most = math.Min(most, float64(11*l.CC))
		}
		return all(within(rs, "A", 0, most+1), reaches(rs, "A", 0.5), within(rs, "B", 0, 0))
	},
	"Requests per second as the autoscaler sees it": func(rs map[string]panelResult, l *openLoad) error {
		return all(within(rs, "A", 0, 2*l.perSecond("")+2), reaches(rs, "A", l.perSecond("")/2), within(rs, "B", 0, 0))
	},
	"Requests in the queue-proxy (queue depth)": func(rs map[string]panelResult, l *openLoad) error {
		if l.CC == 0 {
			return within(rs, "A", 0, l.perSecond("")*l.Slowest+1)
		}
		return all(within(rs, "A", 0, float64(11*l.CC)), reaches(rs, "A", 2))
	},
	"Time in the queue": func(rs map[string]panelResult, l *openLoad) error {
		hi := l.Slowest + 1
		if l.CC == 0 {
			return all(within(rs, "A", 0, hi), within(rs, "B", 0, hi), within(rs, "C", 0, hi))
		}
		return all(within(rs, "A", 0, hi), within(rs, "B", 0, hi), within(rs, "C", 0, hi), reaches(rs, "B", l.Sleep/2))
	},
	"503s from a full queue, per second": func(rs map[string]panelResult, l *openLoad) error {
		hi := 2*l.perSecond("503") + 2
		if l.Status["503"] == 0 {
			return within(rs, "A", 0, 0)
		}
		return all(within(rs, "A", 0, hi), reaches(rs, "A", l.perSecond("503")/2))
	},
	"Start-up: the app's readiness and its first request": func(rs map[string]panelResult, l *openLoad) error {
		return all(within(rs, "A", 0, 600), within(rs, "B", 0, 600))
	},
	"Adaptive concurrency limit": func(rs map[string]panelResult, l *openLoad) error {
		return within(rs, "A", 1, 1000)
	},
	"The app's unloaded latency (adaptive concurrency)": func(rs map[string]panelResult, l *openLoad) error {
		return within(rs, "A", l.Sleep/2, l.Slowest+1)
	},
}

// The panels that must have series for each of the test's revisions (with
// a queue-proxy that serves their families); the others may have some.
var mustShow = map[string][]string{
	"queue": {
		"Requests per second, by status code", "Requests in the range, by status code",
		"Latency through the queue-proxy", "Latency of the app",
		"Concurrency as the autoscaler sees it", "Requests per second as the autoscaler sees it",
		"Requests in the queue-proxy (queue depth)", "Time in the queue", "503s from a full queue, per second",
		"Start-up: the app's readiness and its first request",
	},
	"adaptive": {
		"Requests per second, by status code", "Requests in the range, by status code",
		"Latency through the queue-proxy", "Latency of the app",
		"Adaptive concurrency limit", "The app's unloaded latency (adaptive concurrency)",
	},
}

// The dashboard (deploy/dashboards/qproxy-revision.json) after a load, as
// an operator's Grafana would show it: every panel's query, run against
// the cluster's Prometheus for two revisions under a fixed-rate load, must
// return series (qproxy's own panels none with Knative's queue-proxy), and
// no value that contradicts what the clients sent and saw. One revision
// has containerConcurrency 1 and four times more requests than it can
// answer, so that requests queue and the queue fills; the other has
// qproxy's adaptive concurrency on. What each query returned goes to
// $QPROXY_CLUSTER_DASHBOARD/results.json, which tests/cluster/run
// compares between the queue-proxies and tests/cluster/dashboard draws.
//
// Not parallel: it loads the cluster's only node, and its figures are
// compared with the other queue-proxy's run.
func TestDashboardQueriesAfterALoad(t *testing.T) {
	setConfig(t, "config-features", map[string]string{"queueproxy.mount-podinfo": "allowed"})
	setConfig(t, "config-observability", map[string]string{"request-metrics-protocol": "prometheus"})
	var board dashboard
	text, err := os.ReadFile(filepath.Join(repo(t), "deploy", "dashboards", "qproxy-revision.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(text, &board); err != nil {
		t.Fatalf("deploy/dashboards/qproxy-revision.json: %v", err)
	}
	titles := map[string]bool{}
	for _, p := range board.Panels {
		if p.Type == "row" {
			continue
		}
		titles[p.Title] = true
		if checks[p.Title] == nil {
			t.Errorf("panel %q has no check", p.Title)
		}
	}
	for title := range checks {
		if !titles[title] {
			t.Errorf("a check for %q, which is no panel", title)
		}
	}

	pinned := map[string]string{
		"autoscaling.knative.dev/min-scale":             "1",
		"autoscaling.knative.dev/max-scale":             "1",
		"autoscaling.knative.dev/target-burst-capacity": "0",
	}
	adaptive := map[string]string{
		"features.knative.dev/queueproxy-podinfo":             "enabled",
		"qpextension.knative.dev/qproxy-adaptive-concurrency": "on",
	}
	for k, v := range pinned {
		adaptive[k] = v
	}
	loads := map[string]*openLoad{
		// 20 a second at an app that answers 5 a second one at a time:
		// the queue (10) fills within a second, and most are refused.
		"queue": {Path: "/?sleep=200", Rate: 20, Seconds: 30, Sleep: 0.2, CC: 1},
		// 10 a second at 0.1 s each: about one at a time, enough for the
		// limit's probe.
		"adaptive": {Path: "/?sleep=100", Rate: 10, Seconds: 30, Sleep: 0.1},
	}
	queueSvc := create(t, service{name: "dash-queue", image: image("autoscale"), concurrency: 1, annotations: pinned})
	adaptiveSvc := create(t, service{name: "dash-adaptive", image: image("autoscale"), annotations: adaptive})
	for role, svc := range map[string]ready{"queue": queueSvc, "adaptive": adaptiveSvc} {
		loads[role].Service, loads[role].Revision = svc.name, svc.revision
		eventually(t, svc.name+": the activator out of the path", 2*time.Minute, func() (bool, error) {
			return sksMode(t, svc.revision) == netv1alpha1.SKSOperationModeServe, nil
		})
		eventually(t, svc.name+": its queue-proxy scraped by Prometheus", 2*time.Minute, func() (bool, error) {
			up, err := query(fmt.Sprintf(`up{revision=%q} == 1`, svc.revision), 0, now(), 0)
			return len(up) == 1, err
		})
	}

	c := client(ingress, time.Minute)
	var wg sync.WaitGroup
	for _, l := range loads {
		wg.Add(1)
		go func(l *openLoad) {
			defer wg.Done()
			l.run(c)
		}(l)
	}
	wg.Wait()
	for role, l := range loads {
		t.Logf("%s: %d sent in %.1f s, answers %v, %d errors, slowest %.2f s", role, l.Sent, l.End-l.Start, l.Status, l.Errors, l.Slowest)
		if l.Errors > 0 {
			t.Errorf("%s: %d requests failed", role, l.Errors)
		}
	}
	if loads["queue"].Status["503"] == 0 {
		t.Errorf("the queue never filled: %v", loads["queue"].Status)
	}

	// Every queue-proxy scraped twice after the load.
	last := math.Max(loads["queue"].End, loads["adaptive"].End)
	for _, l := range loads {
		eventually(t, l.Service+": scraped after the load", time.Minute, func() (bool, error) {
			at, err := query(fmt.Sprintf(`timestamp(up{revision=%q})`, l.Revision), 0, now(), 0)
			return err == nil && len(at) == 1 && at[0].Values[0][1] > last+2*scrapeInterval.Seconds(), err
		})
	}
	first := math.Min(loads["queue"].Start, loads["adaptive"].Start) - 10
	at := now()
	results := map[string][]panelResult{}
	for role, l := range loads {
		vars := strings.NewReplacer(
			"$namespace", namespace,
			"$revision", l.Revision,
			"$__rate_interval", rateInterval,
			"$__range", fmt.Sprintf("%ds", int(math.Ceil(at-first))),
		)
		must := map[string]bool{}
		for _, title := range mustShow[role] {
			must[title] = true
		}
		for _, p := range board.Panels {
			if p.Type == "row" {
				continue
			}
			byRef := map[string]panelResult{}
			source := "knative"
			for _, target := range p.Targets {
				if strings.Contains(target.Expr, "qproxy_") {
					source = "qproxy"
				}
			}
			for _, target := range p.Targets {
				expr := vars.Replace(target.Expr)
				step := scrapeInterval
				if p.Type == "stat" {
					step = 0
				}
				series, err := query(expr, first, at, step)
				if err != nil {
					t.Errorf("%s: %q (%s): %v", role, p.Title, target.RefID, err)
					continue
				}
				r := panelResult{Panel: p.Title, Kind: p.Type, Source: source, RefID: target.RefID, Legend: target.Legend, Expr: expr, Series: series}
				byRef[target.RefID] = r
				results[role] = append(results[role], r)
			}
			empty := true
			for _, r := range byRef {
				if len(r.Series) > 0 {
					empty = false
				}
			}
			switch {
			case source == "qproxy" && !isQProxy() && !empty:
				t.Errorf("%s: %q has series with Knative's queue-proxy", role, p.Title)
			case empty && must[p.Title] && (source == "knative" || isQProxy()):
				t.Errorf("%s: %q returned no series", role, p.Title)
			}
			if check := checks[p.Title]; check != nil && !empty {
				if err := check(byRef, l); err != nil {
					t.Errorf("%s: %q contradicts the load: %v", role, p.Title, err)
				}
			}
		}
	}

	if dir := os.Getenv("QPROXY_CLUSTER_DASHBOARD"); dir != "" {
		record := map[string]any{"queue_image": queueImage, "scrape_interval": scrapeInterval.Seconds(), "rate_interval": rateInterval, "loads": loads, "results": results}
		out, err := json.MarshalIndent(record, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "results.json"), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
