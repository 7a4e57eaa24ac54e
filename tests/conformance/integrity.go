package main

// The integrity suite (`go run . -integrity`): what reaches the app is
// exactly what the client sent, or visibly incomplete, and the same for
// responses. Every case (integcases.go) is played against Knative's Go
// queue-proxy and qproxy, in both generations, at containerConcurrency 0
// and 1, cold (a proxy just started, with no connection to the app) and
// warm (the client's connection, and so the proxy's connection to the
// app, served a request first). Each case gets a proxy of its own, so that
// one case's breakage cannot reach the next; the app (integapp.go) lives
// for the whole play and records each request as it came.
//
// The invariant, for every case and every proxy:
//   - the app sees a request complete only if the client sent it whole,
//     and then byte for byte (its body, its trailers);
//   - when the app did not see the client's request complete, the client
//     does not get a success (a 2xx that came whole), unless the app
//     answered before the body (a case that asks for it);
//   - a response the app broke never reaches the client whole;
//   - what the proxy writes to the app is strict HTTP (one framing, no
//     bare LF, ...).
//
// qproxy fails the run on any breach; Go's are reported. Beyond the
// invariant qproxy may be stricter than Go, never more lenient: a request
// sent whole that Go delivers qproxy delivers too, a smuggling case's
// requests reach the app as Go's reach it, or fewer (a refusal), and a
// broken response is counted in the request metrics and logs as Go counts
// it.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// integChildFlag names the hidden flag a child play of the integrity
// suite is started with.
const integChildFlag = "integrity-in-namespace"

// integPlayKey is one play: every case, against one proxy, in one
// generation, at one containerConcurrency, on one path.
type integPlayKey struct {
	Gen   string `json:"gen"`
	Proxy string `json:"proxy"`
	Bin   string `json:"bin"`
	CC    string `json:"cc"`
	Warm  bool   `json:"warm"`
	Logs  string `json:"logs"`
	Only  string `json:"only"`
}

func (k integPlayKey) path() string {
	if k.Warm {
		return "warm"
	}
	return "cold"
}

// caseResult is what one case showed with one proxy.
type caseResult struct {
	Client clientSaw      `json:"client"`
	App    []*wireRequest `json:"app"`
	// Counted are the request metrics' counts by status, and Logged the
	// request log's lines, for response cases.
	Counted []string `json:"counted,omitempty"`
	Logged  []string `json:"logged,omitempty"`
	// Setup is what kept the case from being played.
	Setup string `json:"setup,omitempty"`
	// Took is how long the case took, proxy start to stop.
	Took time.Duration `json:"took"`
	// LeftPartial: a second after the client's outcome, the proxy still
	// held an app connection with part of a request on it.
	LeftPartial bool `json:"left_partial,omitempty"`
	// Next is what the sentinel, a request sent after the case through
	// the same proxy, got: a proxy that pooled a connection the case broke
	// sends it there.
	Next string `json:"next"`
}

// requestLogTemplate is the request log the suite asks of both proxies.
const requestLogTemplate = "RL {{.Request.RequestURI}} {{.Response.Code}} {{.Response.Size}}"

// integEnv is the environment of a play's proxies, for the app on port.
func integEnv(k integPlayKey, port int) ([]string, error) {
	env, err := defaultEnv(k.Gen, port)
	if err != nil {
		return nil, err
	}
	env["CONTAINER_CONCURRENCY"] = k.CC
	if k.Gen == "classic" {
		env["SERVING_ENABLE_REQUEST_LOG"] = "true"
		env["SERVING_REQUEST_LOG_TEMPLATE"] = requestLogTemplate
	} else {
		var o11y map[string]any
		if err := json.Unmarshal([]byte(env["OBSERVABILITY_CONFIG"]), &o11y); err != nil {
			return nil, err
		}
		o11y["enableRequestLog"] = true
		o11y["requestLogTemplate"] = requestLogTemplate
		doc, _ := json.Marshal(o11y)
		env["OBSERVABILITY_CONFIG"] = string(doc)
	}
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	sort.Strings(vars)
	return vars, nil
}

// playIntegrity plays every case of k, here, one proxy each.
func playIntegrity(k integPlayKey) map[string]*caseResult {
	results := map[string]*caseResult{}
	app, err := startRecorder()
	if err != nil {
		results["setup"] = &caseResult{Setup: err.Error()}
		return results
	}
	env, err := integEnv(k, app.Port)
	if err != nil {
		results["setup"] = &caseResult{Setup: err.Error()}
		return results
	}
	for _, c := range integCases() {
		if k.Only != "" && !strings.Contains(c.Name, k.Only) {
			continue
		}
		results[c.Name] = playCase(&c, k, env, app)
	}
	return results
}

// playCase plays c against a proxy started for it.
func playCase(c *integCase, k integPlayKey, env []string, app *recorder) *caseResult {
	res := &caseResult{}
	start := time.Now()
	defer func() { res.Took = time.Since(start) }()
	logPath := filepath.Join(k.Logs, fmt.Sprintf("integrity.%s.%s.cc%s.%s.%s.log", k.Gen, k.Proxy, k.CC, k.path(), c.Name))
	logFile, err := os.Create(logPath)
	if err != nil {
		res.Setup = err.Error()
		return res
	}
	cmd := exec.Command(k.Bin)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		res.Setup = err.Error()
		return res
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logFile.Close(); close(exited) }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
		waitFree()
	}
	if !waitListening(8012, exited) || !waitListening(9091, exited) {
		stop()
		res.Setup = "the proxy did not listen"
		return res
	}
	if c.Proto == "h2" {
		res.Client = playH2(c, k.Warm)
	} else {
		res.Client = playH1(c, k.Warm)
	}
	// A proxy that goes on writing to the app after the client's outcome
	// would show it here: the app's connections are let settle (no
	// request in part) before the proxy goes.
	res.LeftPartial = !waitFor(time.Second, app.quiet)
	res.Next = sendSentinel()
	if c.Kind == "response" {
		res.Counted = countedByStatus(k.Gen, k.Warm)
	}
	stop()
	waitFor(2*time.Second, app.closed)
	res.App = app.Take()
	if c.Kind == "response" {
		raw, _ := os.ReadFile(logPath)
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "RL /r/") {
				res.Logged = append(res.Logged, line)
			}
		}
	}
	return res
}

// waitFor polls cond until it holds or limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// sentinelPath is a request sent after a response case, once its client
// is done: when the proxy has counted it, it has counted the case's
// request too, which came first. (A proxy's counters show what an aborted
// request was counted as a moment after its client saw the end, and
// current Knative's HTTP server instruments never count it at all, so no
// count of the case's own can be waited for.)
const sentinelPath = "/__sentinel"

// runnersOwn says whether target is one of the runner's own requests,
// which the app answers and the verdicts leave out.
func runnersOwn(target string) bool {
	return target == warmPath || target == sentinelPath
}

// sendSentinel sends the sentinel on a new connection and says what it
// got: "200 ok" when the proxy served it whole.
func sendSentinel() string {
	client := http.Client{Timeout: caseDeadline}
	res, err := client.Get("http://127.0.0.1:8012" + sentinelPath)
	if err != nil {
		return errClass(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Sprintf("%d cut: %s", res.StatusCode, errClass(err))
	}
	if res.StatusCode == 200 && string(body) == "got 0 bytes" {
		return "200 ok"
	}
	return fmt.Sprintf("%d %q", res.StatusCode, body)
}

// countedByStatus reads the request counters of gen once they have
// counted the sentinel (or 3 s pass), and returns each counter's sum by
// status. A warm play's warm-up was counted before the case.
func countedByStatus(gen string, warm bool) []string {
	// Requests answered 200 and whole: the sentinel, and the warm-up; each
	// counter counts both.
	whole := 1.0
	if warm {
		whole++
	}
	var text string
	sums := map[string]float64{}
	waitFor(3*time.Second, func() bool {
		res, err := http.Get("http://127.0.0.1:9091/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var b strings.Builder
		_, err = io.Copy(&b, res.Body)
		text = b.String()
		sums = countsByStatus(text)
		for _, c := range requestCounters[gen] {
			if sums[c+" 200"] < whole {
				return false
			}
		}
		return err == nil
	})
	var out []string
	for k, v := range sums {
		out = append(out, fmt.Sprintf("%s: %g", k, v))
	}
	sort.Strings(out)
	return out
}

// countsByStatus sums every request counter of a Prometheus text
// exposition by metric and status ("revision_request_count 200").
func countsByStatus(text string) map[string]float64 {
	sums := map[string]float64{}
	for _, sm := range samples(text) {
		// Every count of a request metric, the client's to the app among
		// them (qproxy's own additions have no counterpart).
		counter := strings.HasSuffix(sm.metric, "request_count") ||
			strings.HasPrefix(sm.metric, "http_") && strings.HasSuffix(sm.metric, "_count") ||
			strings.HasPrefix(sm.metric, "kn_serving_invocation") && strings.HasSuffix(sm.metric, "_count")
		if !counter {
			continue
		}
		code := labelValue(sm.name, "response_code")
		if code == "" {
			code = labelValue(sm.name, "http_response_status_code")
		}
		v, _ := strconv.ParseFloat(sm.value, 64)
		sums[sm.metric+" "+code] += v
	}
	return sums
}

// labelValue is the value of label in a sample's name, or "".
func labelValue(name, label string) string {
	_, rest, ok := strings.Cut(name, label+`="`)
	if !ok {
		return ""
	}
	value, _, _ := strings.Cut(rest, `"`)
	return value
}

// runIntegChild is the child's side of playIntegrityIsolated.
func runIntegChild(arg string) int {
	return childSide("integrity", arg, func(k integPlayKey) (any, error) {
		return playIntegrity(k), nil
	})
}

// playIntegrityIsolated plays k in a child process in a network namespace
// of its own.
func playIntegrityIsolated(k integPlayKey) (map[string]*caseResult, error) {
	var results map[string]*caseResult
	err := inNamespace(integChildFlag, k, &results)
	return results, err
}

// breaches are what of r breaks the invariant for case c.
func breaches(c *integCase, r *caseResult) []string {
	if r == nil {
		return []string{"not played"}
	}
	if r.Setup != "" {
		return []string{"setup: " + r.Setup}
	}
	var out []string
	delivered := false
	for _, req := range r.App {
		if runnersOwn(req.Target) {
			continue
		}
		if req.Violation != "" {
			out = append(out, fmt.Sprintf("the app read bytes no strict parser takes (%s)", req.Violation))
		}
		if !req.Complete {
			continue
		}
		sent, ok := c.Sent[req.Target]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("the app got %s %s complete, which the client never sent whole", req.Method, req.Target))
		case req.Method != sent.Method || string(req.Body) != sent.Body:
			out = append(out, fmt.Sprintf("the app got %s %s complete with %d bytes that are not the %d the client sent", req.Method, req.Target, len(req.Body), len(sent.Body)))
		case !sameTrailers(req.Trailers, sent.Trailers):
			out = append(out, fmt.Sprintf("the app got %s %s with trailers %v, the client sent %v", req.Method, req.Target, req.Trailers, sent.Trailers))
		default:
			delivered = true
		}
	}
	if r.LeftPartial {
		out = append(out, "a second after the client's outcome, an app connection still held part of a request")
	}
	if r.Next != "200 ok" {
		out = append(out, "the next request through the proxy got "+r.Next)
	}
	switch c.Kind {
	case "request":
		if !delivered && !c.Early && r.Client.success() {
			out = append(out, fmt.Sprintf("the client got %d whole, yet the app never had its request whole", r.Client.Responses[0].Status))
		}
	case "response":
		if r.Client.wholeResponse() {
			out = append(out, "the client got the app's broken answer whole")
		}
		// So that the comparison of request logs with Go's is not of two
		// empty lists.
		if len(r.Logged) == 0 {
			out = append(out, "no request log line for the case")
		}
	}
	return out
}

func sameTrailers(got, sent [][2]string) bool {
	if len(got) != len(sent) {
		return false
	}
	for i := range got {
		if !strings.EqualFold(got[i][0], sent[i][0]) || got[i][1] != sent[i][1] {
			return false
		}
	}
	return true
}

// delivered is what reached the app complete in r, as "METHOD target N
// bytes", in order.
func delivered(r *caseResult) []string {
	var out []string
	if r == nil {
		return out
	}
	for _, req := range r.App {
		if req.Complete && !runnersOwn(req.Target) {
			out = append(out, fmt.Sprintf("%s %s %d bytes %s", req.Method, req.Target, len(req.Body), crc(string(req.Body))))
		}
	}
	return out
}

// laxer says where qproxy is more lenient than Go in case c: what it
// delivers beyond Go's, a request sent whole that Go delivers and it does
// not answer with success, a broken response counted otherwise.
func laxer(c *integCase, g, q *caseResult) []string {
	if g == nil || q == nil || g.Setup != "" || q.Setup != "" {
		return nil
	}
	var out []string
	gd, qd := delivered(g), delivered(q)
	if len(qd) > len(gd) || !slices.Equal(qd, gd[:len(qd)]) {
		out = append(out, fmt.Sprintf("the app got %v from qproxy, %v from Go", qd, gd))
	}
	if c.Kind == "request" && len(c.Sent) > 0 && g.Client.success() && !q.Client.success() {
		out = append(out, fmt.Sprintf("a request sent whole: Go answered %s, qproxy %s", describeClient(g.Client), describeClient(q.Client)))
	}
	if c.Kind == "request" && c.Proto == "h1" && len(c.Sent) == 0 && q.Client.End == "open" && g.Client.End != "open" {
		out = append(out, fmt.Sprintf("after a broken body the client's connection stayed open (Go's: %s): where a next request would start is unknown", g.Client.End))
	}
	if c.Kind == "response" {
		if !slices.Equal(g.Counted, q.Counted) {
			out = append(out, fmt.Sprintf("request metrics: Go %v, qproxy %v", g.Counted, q.Counted))
		}
		if !slices.Equal(statusesOf(g.Logged), statusesOf(q.Logged)) {
			out = append(out, fmt.Sprintf("request logs: Go %v, qproxy %v", g.Logged, q.Logged))
		}
	}
	return out
}

// statusesOf keeps a request log line's target and status.
func statusesOf(lines []string) []string {
	var out []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 3 {
			out = append(out, f[1]+" "+f[2])
		}
	}
	return out
}

// describeClient is a client's outcome in a few words, for the report.
func describeClient(s clientSaw) string {
	var parts []string
	for _, r := range s.Responses {
		p := strconv.Itoa(r.Status)
		if !r.Whole {
			p += " (cut: " + r.Error + ")"
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		parts = append(parts, "no answer")
	}
	return strings.Join(parts, ", ") + "; " + s.End
}

// describeApp is what the app got, in a few words.
func describeApp(r *caseResult) string {
	var parts []string
	for _, req := range r.App {
		if runnersOwn(req.Target) {
			continue
		}
		p := fmt.Sprintf("%s %s %dB", req.Method, req.Target, len(req.Body))
		if req.Method == "" {
			p = "a part of a head"
		}
		switch {
		case req.Violation != "":
			p += " (" + req.Violation + ")"
		case req.Reset != "":
			p += " (reset " + req.Reset + ")"
		case !req.Complete:
			p += " (unfinished)"
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// runIntegrity plays every case (or those whose name matches only) in
// every play, writes the report, and says whether qproxy kept the
// invariant and was never laxer than Go.
func runIntegrity(generations []Generation, bin, logs, report, only string) bool {
	start := time.Now()
	type play struct {
		key     integPlayKey
		results map[string]*caseResult
		err     error
	}
	var plays []*play
	for _, g := range generations {
		for _, cc := range []string{"0", "1"} {
			for _, warm := range []bool{false, true} {
				for _, p := range []proxy{{"go", g.Oracle}, {"qproxy", bin}} {
					plays = append(plays, &play{key: integPlayKey{Gen: g.Name, Proxy: p.name, Bin: p.bin, CC: cc, Warm: warm, Logs: logs, Only: only}})
				}
			}
		}
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for _, p := range plays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			p.results, p.err = playIntegrityIsolated(p.key)
		}()
	}
	wg.Wait()

	var failures, goBreaches, differs strings.Builder
	failed, goFailed, played := 0, 0, 0
	cases := integCases()
	for i := 0; i < len(plays); i += 2 {
		g, q := plays[i], plays[i+1]
		where := fmt.Sprintf("%s | cc %s | %s", g.key.Gen, g.key.CC, g.key.path())
		for _, pl := range []*play{g, q} {
			if pl.err != nil {
				fmt.Fprintf(&failures, "| (all) | %s | %s: %v |\n", where, pl.key.Proxy, pl.err)
				failed++
			}
		}
		if g.err != nil || q.err != nil {
			continue
		}
		for ci := range cases {
			c := &cases[ci]
			if only != "" && !nameMatches(c.Name, only) {
				continue
			}
			played++
			gr, qr := g.results[c.Name], q.results[c.Name]
			for _, b := range breaches(c, qr) {
				fmt.Fprintf(&failures, "| %s | %s | qproxy: %s |\n", c.Name, where, b)
				failed++
			}
			for _, b := range laxer(c, gr, qr) {
				fmt.Fprintf(&failures, "| %s | %s | laxer than Go: %s |\n", c.Name, where, b)
				failed++
			}
			for _, b := range breaches(c, gr) {
				fmt.Fprintf(&goBreaches, "| %s | %s | %s |\n", c.Name, where, b)
				goFailed++
			}
			if gr != nil && qr != nil && (describeClient(gr.Client) != describeClient(qr.Client) || describeApp(gr) != describeApp(qr)) {
				fmt.Fprintf(&differs, "| %s | %s | %s | %s | %s | %s |\n", c.Name, where,
					cell(describeClient(gr.Client)), cell(describeClient(qr.Client)), cell(describeApp(gr)), cell(describeApp(qr)))
			}
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "# Integrity: what reaches the app and the client, qproxy beside Knative's Go queue-proxy\n\n")
	fmt.Fprintf(&out, "Run %s, %s; qproxy `%s`. %d cases, each in both generations, at containerConcurrency 0 and 1, cold and warm: %d plays with each proxy.\n\n",
		time.Now().UTC().Format(time.RFC3339), time.Since(start).Round(time.Second), bin, len(casesMatching(only)), played)
	fmt.Fprintf(&out, "## What fails the run (qproxy)\n\n")
	if failed == 0 {
		fmt.Fprintf(&out, "Nothing: qproxy kept the invariant in every play of every case, and was nowhere laxer than Go.\n\n")
	} else {
		fmt.Fprintf(&out, "| case | generation | concurrency | path | what |\n|---|---|---|---|---|\n%s\n", failures.String())
	}
	fmt.Fprintf(&out, "## Where Go's queue-proxy breaks the invariant\n\n")
	if goFailed == 0 {
		fmt.Fprintf(&out, "Nowhere.\n\n")
	} else {
		fmt.Fprintf(&out, "| case | generation | concurrency | path | what |\n|---|---|---|---|---|\n%s\n", goBreaches.String())
	}
	fmt.Fprintf(&out, "## Where the two differ (within the invariant)\n\n| case | generation | concurrency | path | client: Go | client: qproxy | app: Go | app: qproxy |\n|---|---|---|---|---|---|---|---|\n%s\n", differs.String())
	fmt.Fprintf(&out, "qproxy: %d breaches or leniencies; Go: %d breaches.\n", failed, goFailed)
	// The slowest cases, where a run's time goes.
	type took struct {
		name string
		d    time.Duration
	}
	var slow []took
	for _, p := range plays {
		for name, r := range p.results {
			slow = append(slow, took{p.key.Proxy + " " + p.key.Gen + " cc" + p.key.CC + " " + p.key.path() + " " + name, r.Took})
		}
	}
	sort.Slice(slow, func(i, j int) bool { return slow[i].d > slow[j].d })
	fmt.Fprintf(&out, "\nSlowest:")
	for _, t := range slow[:min(len(slow), 10)] {
		fmt.Fprintf(&out, " %s %s;", t.name, t.d.Round(time.Millisecond))
	}
	fmt.Fprintln(&out)
	os.MkdirAll(filepath.Dir(report), 0o755)
	os.WriteFile(report, []byte(out.String()), 0o644)
	fmt.Print(out.String())
	return failed == 0
}

// casesMatching are the cases whose name matches only.
func casesMatching(only string) []integCase {
	var out []integCase
	for _, c := range integCases() {
		if only == "" || nameMatches(c.Name, only) {
			out = append(out, c)
		}
	}
	return out
}
