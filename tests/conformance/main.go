// Command conformance plays each scenario of scenarios/ against Knative's Go
// queue-proxy and against qproxy, with the same environment and the same
// app, and reports every field where the two differ. A difference not in
// expected.yaml, with its reason, makes it exit 1.
//
//	go run . -qproxy ../../target/debug/qproxy -oracle ../../target/oracle/queue-v0.42.2
//
// The oracle is built from the Go module proxy (tests/oracle/build.sh) when
// it is not there yet.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proxy is one queue-proxy under test.
type proxy struct {
	name string
	bin  string
}

// Generation is one generation of Knative, with the oracle of its queue-proxy.
type Generation struct {
	Name string
	// Version of knative.dev/serving the oracle is built from.
	Version string
	// Oracle is the path of that queue-proxy.
	Oracle string
}

// knativeEnvFile holds what a default Knative install gives a revision's
// sidecar; qproxy's tests and the benchmark harness read it too.
const knativeEnvFile = "../../crates/core/knative-env.json"

// defaultEnv is what a default install of Knative's generation gen gives a
// revision's sidecar, with the app on userPort. Current Knative's stock
// configuration turns request metrics off; here they are served as
// Prometheus, as classic Knative serves them by default, so that the
// metrics scenarios see them in both generations.
func defaultEnv(gen string, userPort int) (map[string]string, error) {
	raw, err := os.ReadFile(knativeEnvFile)
	if err != nil {
		return nil, err
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", knativeEnvFile, err)
	}
	env := map[string]string{}
	for _, part := range []string{"common", gen} {
		var vars map[string]string
		if err := json.Unmarshal(file[part], &vars); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", knativeEnvFile, part, err)
		}
		for k, v := range vars {
			env[k] = v
		}
	}
	env["USER_PORT"] = strconv.Itoa(userPort)
	if gen == "current" {
		var o11y map[string]any
		if err := json.Unmarshal([]byte(env["OBSERVABILITY_CONFIG"]), &o11y); err != nil {
			return nil, fmt.Errorf("%s: OBSERVABILITY_CONFIG: %w", knativeEnvFile, err)
		}
		o11y["requestMetrics"] = map[string]string{"protocol": "prometheus"}
		doc, _ := json.Marshal(o11y)
		env["OBSERVABILITY_CONFIG"] = string(doc)
	}
	return env, nil
}

func main() {
	qproxyBin := flag.String("qproxy", "../../target/debug/qproxy", "qproxy binary")
	classicOracle := flag.String("oracle-classic", "../../target/oracle/queue-v0.42.2", "Knative's Go queue-proxy, classic generation (serving v0.42.2)")
	currentOracle := flag.String("oracle-current", "../../target/oracle/queue-v0.50.0", "Knative's Go queue-proxy, current generation (serving v0.50.0)")
	onlyGeneration := flag.String("generation", "", "run only this generation: classic or current")
	dir := flag.String("scenarios", "scenarios", "folder of scenario files")
	expectedFile := flag.String("expected", "expected.yaml", "the known differences, explained")
	differencesDoc := flag.String("differences", "", "write the known differences as Markdown to this file, and exit")
	report := flag.String("report", "../../target/conformance/report.md", "where to write the report")
	only := flag.String("only", "", "run the scenarios (or the failure or integrity cases) whose name matches this regular expression")
	isolate := flag.Bool("isolate", true, "play each run in a network namespace of its own, a scenario's runs at once (needs root; without it, one run at a time)")
	scenariosAtOnce := flag.Int("scenarios-at-once", 3, "with -isolate, how many scenarios are played at once (their results still come in order)")
	emulated := flag.Bool("emulated", false, "the proxies run under emulation (qemu-user): the wall-clock classes (fields ending .timing or .after-signal) are recorded and shown but not compared, since emulation's speed is not the architecture's")
	child := flag.String(childFlag, "", "(internal: one run, in the namespace the runner made for it)")
	failureSuite := flag.Bool("failures", false, "play the failure-mode suite (failures.go) instead of the scenarios; the report goes to ../../target/conformance/failures.md")
	failChild := flag.String(failChildFlag, "", "(internal: one play of a failure case, in the namespace the runner made for it)")
	integritySuite := flag.Bool("integrity", false, "play the integrity suite (integrity.go) instead of the scenarios; the report goes to ../../target/conformance/integrity.md")
	integChild := flag.String(integChildFlag, "", "(internal: one play of the integrity suite, in the namespace the runner made for it)")
	flag.Parse()
	clockNotCompared = *emulated
	if _, err := regexp.Compile(*only); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: -only:", err)
		os.Exit(2)
	}
	if *integChild != "" {
		os.Exit(runIntegChild(*integChild))
	}
	if *child != "" {
		os.Exit(runChild(*child))
	}
	if *failChild != "" {
		os.Exit(runFailChild(*failChild))
	}

	differences, err := LoadDifferences(*expectedFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	if *differencesDoc != "" {
		if err := os.WriteFile(*differencesDoc, []byte(RenderDifferences(differences)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(2)
		}
		return
	}
	var generations []Generation
	for _, g := range []Generation{
		{"classic", "v0.42.2", *classicOracle},
		{"current", "v0.50.0", *currentOracle},
	} {
		if *onlyGeneration != "" && *onlyGeneration != g.Name {
			continue
		}
		if _, err := os.Stat(g.Oracle); os.IsNotExist(err) {
			// Knative's queue-proxy, built from the Go module proxy.
			build := exec.Command("../oracle/build.sh", g.Version, g.Oracle)
			build.Stdout, build.Stderr = os.Stderr, os.Stderr
			if err := build.Run(); err != nil {
				fmt.Fprintln(os.Stderr, "conformance: building the Go queue-proxy", g.Version+":", err)
				os.Exit(2)
			}
		}
		generations = append(generations, g)
	}
	if len(generations) == 0 {
		fmt.Fprintln(os.Stderr, "conformance: no generation", *onlyGeneration, "(classic or current)")
		os.Exit(2)
	}
	if *integritySuite {
		logs, _ := filepath.Abs(filepath.Join(filepath.Dir(*report), "logs"))
		os.MkdirAll(logs, 0o755)
		if !canIsolate() {
			fmt.Fprintln(os.Stderr, "conformance: the integrity suite needs network namespaces (root): each play listens on Knative's fixed ports")
			os.Exit(2)
		}
		bin, _ := filepath.Abs(*qproxyBin)
		for i := range generations {
			generations[i].Oracle, _ = filepath.Abs(generations[i].Oracle)
		}
		if !runIntegrity(generations, bin, logs, filepath.Join(filepath.Dir(*report), "integrity.md"), *only) {
			os.Exit(1)
		}
		return
	}
	if *failureSuite {
		logs, _ := filepath.Abs(filepath.Join(filepath.Dir(*report), "logs"))
		os.MkdirAll(logs, 0o755)
		if *isolate && !canIsolate() {
			fmt.Fprintln(os.Stderr, "conformance: the failure-mode suite needs network namespaces (root): each play listens on Knative's fixed ports")
			os.Exit(2)
		}
		bin, _ := filepath.Abs(*qproxyBin)
		for i := range generations {
			generations[i].Oracle, _ = filepath.Abs(generations[i].Oracle)
		}
		out := filepath.Join(filepath.Dir(*report), "failures.md")
		if !runFailures(generations, bin, logs, out, *only, *isolate) {
			os.Exit(1)
		}
		return
	}
	scenarios, err := LoadScenarios(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	expected := Expectations(differences)
	if err := checkScenarios(expected, scenarios); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	logs, _ := filepath.Abs(filepath.Join(filepath.Dir(*report), "logs"))
	os.MkdirAll(logs, 0o755)
	scenarioDir, _ := filepath.Abs(*dir)
	if *isolate && !canIsolate() {
		fmt.Fprintln(os.Stderr, "conformance: no network namespaces (not root?): one run at a time, on this machine's loopback")
		*isolate = false
	}
	// A TLS scenario's certificate, made afresh for each run.
	certs := filepath.Join(filepath.Dir(logs), "certs")
	if err := makeCerts(certs); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: making the TLS certificate:", err)
		os.Exit(2)
	}
	bin, _ := filepath.Abs(*qproxyBin)
	for i := range generations {
		generations[i].Oracle, _ = filepath.Abs(generations[i].Oracle)
	}

	// What each scenario showed in each generation, for the summary.
	summary := map[string]map[string]string{}
	var details strings.Builder
	// The unexplained and stale rows again, printed last when the run fails.
	var failures strings.Builder
	// Scenarios played a second time because a timing alone differed.
	var replayed []string
	totals := map[string]map[string]int{}
	ran := map[string]int{}
	skipped := map[string]bool{}
	unexplained := 0
	if !*isolate || *scenariosAtOnce < 1 {
		*scenariosAtOnce = 1
	}
	// Scenarios are played a few at once (most of a long one is waiting:
	// a drain is 30 s whoever drains), each run in namespaces of its own;
	// they are compared and reported one by one, in order, as they end.
	type played struct {
		// By generation, path (cold, warm) and proxy (go, qproxy).
		obs  [][2][2]*Observation
		took time.Duration
		done chan struct{}
	}
	playOne := func(sc Scenario, pl *played) {
		defer close(pl.done)
		start := time.Now()
		// Each generation's two runs: isolated, all of them at once.
		var wg sync.WaitGroup
		for gi, g := range generations {
			if !sc.In(g.Name) {
				continue
			}
			for pi, path := range paths {
				warm := path == "warm"
				for i, p := range []proxy{{"go", g.Oracle}, {"qproxy", bin}} {
					run := func() {
						var obs *Observation
						if *isolate {
							obs = playIsolated(sc, g.Name, p, warm, logs, scenarioDir, certs)
						} else {
							obs = play(sc, g.Name, p, warm, logs)
						}
						pl.obs[gi][pi][i] = obs
						dump(obs, filepath.Join(logs, runName(sc.Name, g.Name, p.name, warm)+".fields"))
					}
					if !*isolate {
						run()
						continue
					}
					wg.Add(1)
					go func() { defer wg.Done(); run() }()
				}
			}
		}
		wg.Wait()
		pl.took = time.Since(start)
	}
	plays := make([]*played, len(scenarios))
	for si, sc := range scenarios {
		if *only != "" && !nameMatches(sc.Name, *only) || sc.TLS && !*isolate {
			continue
		}
		plays[si] = &played{obs: make([][2][2]*Observation, len(generations)), done: make(chan struct{})}
	}
	slots := make(chan struct{}, *scenariosAtOnce)
	go func() {
		for si, sc := range scenarios {
			if plays[si] == nil {
				continue
			}
			slots <- struct{}{}
			go func() {
				defer func() { <-slots }()
				playOne(sc, plays[si])
			}()
		}
	}()
	for si, sc := range scenarios {
		if *only != "" && !nameMatches(sc.Name, *only) {
			continue
		}
		if sc.TLS && !*isolate {
			// Go's queue-proxy reads the certificate from a fixed path,
			// which only a mount namespace of the run's own may hold.
			fmt.Fprintf(os.Stderr, "%-40s skipped: TLS scenarios need isolated runs (root)\n", sc.Name)
			skipped[sc.Name] = true
			continue
		}
		summary[sc.Name] = map[string]string{}
		pl := plays[si]
		<-pl.done
		// A difference in timing alone is played again once: a run slowed
		// by the ones beside it is no behaviour of either proxy, and a
		// real difference shows again.
		marks := usedMarks(expected)
		if timingAloneDiffers(sc, generations, pl.obs, expected) {
			fmt.Fprintf(os.Stderr, "%-40s played again: only a timing differed\n", sc.Name)
			replayed = append(replayed, sc.Name)
			// The first play is not judged: what it matched proves no
			// expectation still true.
			restoreUsedMarks(expected, marks)
			again := &played{obs: make([][2][2]*Observation, len(generations)), done: make(chan struct{})}
			// In a slot of its own, like every play: without isolation,
			// two plays at once would share the ports.
			slots <- struct{}{}
			playOne(sc, again)
			<-slots
			pl = again
		}
		obs := pl.obs
		for gi, g := range generations {
			for pi, path := range paths {
				col := g.Name + " " + path
				if !sc.In(g.Name) {
					summary[sc.Name][col] = "(not in this generation)"
					continue
				}
				if totals[col] == nil {
					totals[col] = map[string]int{}
				}
				ran[col]++
				rows := compare(sc.Name, g.Name, path, obs[gi][pi][0], obs[gi][pi][1], expected)
				same, expectedDiffs, unexplainedHere := 0, 0, 0
				for _, r := range rows {
					switch r.verdict {
					case "same":
						same++
					case "DIFFERS":
						unexplainedHere++
					default:
						expectedDiffs++
					}
					if r.verdict != "same" {
						line := fmt.Sprintf("| %s | %s | %s | `%s` | %s | %s | %s |\n", sc.Name, g.Name, path, r.field, cell(r.a), cell(r.b), r.verdict)
						details.WriteString(line)
						if r.verdict == "DIFFERS" {
							failures.WriteString(line)
						}
					}
					totals[col][strings.SplitN(r.verdict, " ", 2)[0]]++
				}
				unexplained += unexplainedHere
				verdict := fmt.Sprintf("same (%d fields)", same)
				if expectedDiffs > 0 {
					verdict = fmt.Sprintf("%d same, %d as expected", same, expectedDiffs)
				}
				if unexplainedHere > 0 {
					verdict = fmt.Sprintf("**%d DIFFER**, %d as expected, %d same", unexplainedHere, expectedDiffs, same)
				}
				summary[sc.Name][col] = verdict
				fmt.Fprintf(os.Stderr, "%-40s %-8s %-4s %3d fields, %d differ  (%s)\n", sc.Name, g.Name, path, len(rows), len(rows)-same, pl.took.Round(time.Millisecond))
			}
		}
	}
	stale := 0
	if *only == "" {
		for _, e := range expected {
			for _, g := range generations {
				for _, path := range paths {
					if !e.AppliesTo(g.Name, path) || e.used[g.Name+" "+path] || e.Sometimes || skipped[e.Scenario] {
						continue
					}
					if sc := findScenario(scenarios, e.Scenario); sc != nil && !sc.In(g.Name) {
						continue
					}
					stale++
					line := fmt.Sprintf("| %s | %s | %s | `%s` | | | STALE: %s no longer differs here |\n", e.Scenario, g.Name, path, e.Field, e.Why.ID)
					details.WriteString(line)
					failures.WriteString(line)
				}
			}
		}
	}

	var out strings.Builder
	fmt.Fprintf(&out, "# Conformance: qproxy against Knative's Go queue-proxy\n\n")
	fmt.Fprintf(&out, "Run %s; qproxy `%s`.\n\n", time.Now().UTC().Format(time.RFC3339), *qproxyBin)
	fmt.Fprintf(&out, "| scenario |")
	for _, g := range generations {
		for _, path := range paths {
			fmt.Fprintf(&out, " %s (serving %s), %s |", g.Name, g.Version, path)
		}
	}
	fmt.Fprintf(&out, "\n|---|")
	for range generations {
		for range paths {
			fmt.Fprintf(&out, "---|")
		}
	}
	fmt.Fprintln(&out)
	for _, sc := range scenarios {
		if summary[sc.Name] == nil {
			continue
		}
		fmt.Fprintf(&out, "| %s |", sc.Name)
		for _, g := range generations {
			for _, path := range paths {
				fmt.Fprintf(&out, " %s |", summary[sc.Name][g.Name+" "+path])
			}
		}
		fmt.Fprintln(&out)
	}
	fmt.Fprintf(&out, "\n## Fields that differ\n\n| scenario | generation | path | field | go | qproxy | verdict |\n|---|---|---|---|---|---|---|\n%s\n", details.String())
	for _, g := range generations {
		for _, path := range paths {
			col := g.Name + " " + path
			t := totals[col]
			fmt.Fprintf(&out, "%s, %s (oracle `%s`): %d scenarios; fields: %d same, %d differ as expected, %d differ unexplained.\n",
				g.Name, path, g.Oracle, ran[col], t["same"], t["differs"], t["DIFFERS"])
			if t["unclocked"] > 0 {
				fmt.Fprintf(&out, "%s, %s: %d wall-clock classes differ, not compared under emulation.\n", g.Name, path, t["unclocked"])
			}
		}
	}
	fmt.Fprintf(&out, "%d stale expectations.\n", stale)
	if len(replayed) > 0 {
		fmt.Fprintf(&out, "Played again because a timing alone differed: %s.\n", strings.Join(replayed, ", "))
	}
	os.MkdirAll(filepath.Dir(*report), 0o755)
	os.WriteFile(*report, []byte(out.String()), 0o644)
	fmt.Print(out.String())
	if unexplained > 0 || stale > 0 {
		// Repeated last, where a log cut to its tail still shows them.
		fmt.Printf("\n## What fails the run\n\n| scenario | generation | path | field | go | qproxy | verdict |\n|---|---|---|---|---|---|---|\n%s", failures.String())
		os.Exit(1)
	}
}

// timingAloneDiffers says whether the only unexplained differences of a
// play, in any generation, are timing classes.
func timingAloneDiffers(sc Scenario, generations []Generation, obs [][2][2]*Observation, expected []*Expected) bool {
	timing := false
	for gi, g := range generations {
		if !sc.In(g.Name) {
			continue
		}
		for pi, path := range paths {
			for _, r := range compare(sc.Name, g.Name, path, obs[gi][pi][0], obs[gi][pi][1], expected) {
				if r.verdict != "DIFFERS" {
					continue
				}
				if !wallClock(r.field) {
					return false
				}
				timing = true
			}
		}
	}
	return timing
}

// clockNotCompared is -emulated: wall-clock classes are not compared.
var clockNotCompared bool

// wallClock says whether a field is a wall-clock class (see timing).
func wallClock(field string) bool {
	return strings.HasSuffix(field, ".timing") || strings.HasSuffix(field, ".after-signal")
}

// paths are the two ways every scenario is played: cold, each request on a
// new client connection to a proxy with no connection to the app yet (but
// what the scenario's own steps left), and warm, each request to the app
// on a client connection that served one first, and so with the proxy's
// connection to the app pooled.
var paths = []string{"cold", "warm"}

// runName names a run's log and fields files.
func runName(scenario, gen, proxy string, warm bool) string {
	name := scenario + "." + gen + "." + proxy
	if warm {
		name += ".warm"
	}
	return name
}

// usedMarks copies which generations each expectation has matched so far.
func usedMarks(expected []*Expected) []map[string]bool {
	marks := make([]map[string]bool, len(expected))
	for i, e := range expected {
		marks[i] = maps.Clone(e.used)
	}
	return marks
}

// restoreUsedMarks puts back what usedMarks copied.
func restoreUsedMarks(expected []*Expected, marks []map[string]bool) {
	for i, e := range expected {
		e.used = marks[i]
	}
}

func findScenario(scenarios []Scenario, name string) *Scenario {
	for i := range scenarios {
		if scenarios[i].Name == name {
			return &scenarios[i]
		}
	}
	return nil
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	if s == "" {
		return "—"
	}
	return "`" + s + "`"
}

type row struct{ field, a, b, verdict string }

const absent = "(absent)"

func compare(scenario, gen, path string, a, b *Observation, expected []*Expected) []row {
	names := map[string]bool{}
	var order []string
	for _, o := range []*Observation{a, b} {
		for _, n := range o.order {
			if !names[n] {
				names[n] = true
				order = append(order, n)
			}
		}
	}
	var rows []row
	for _, n := range order {
		va, oka := a.fields[n]
		vb, okb := b.fields[n]
		if !oka {
			va = absent
		}
		if !okb {
			vb = absent
		}
		r := row{field: n, a: va, b: vb, verdict: "same"}
		if va != vb {
			r.verdict = "DIFFERS"
			for _, e := range expected {
				if (e.Scenario != scenario && e.Scenario != "*") || !e.AppliesTo(gen, path) {
					continue
				}
				if e.Matches(n) {
					e.used[gen+" "+path] = true
					r.verdict = "differs (expected: " + e.Why.ID + ", " + e.Why.Title + ")"
					break
				}
			}
			if r.verdict == "DIFFERS" && clockNotCompared && wallClock(n) {
				r.verdict = "unclocked (emulated: a wall-clock class is not compared)"
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// dump writes every field of a run, in full, next to its log.
func dump(obs *Observation, file string) {
	var b strings.Builder
	for _, n := range obs.order {
		fmt.Fprintf(&b, "%s = %s\n", n, obs.fields[n])
	}
	os.WriteFile(file, []byte(b.String()), 0o644)
}

// answeredOnMain counts the answers to r's exchange e (its warm-up's
// among them) that the main port's request metrics count.
func answeredOnMain(r *Request, e exchange) int {
	if r.Port != "" && r.Port != "main" {
		return 0
	}
	n := 0
	for _, status := range []string{e["status"], e["warmup"]} {
		if _, err := strconv.Atoi(strings.Fields(status + " x")[0]); err == nil {
			n++
		}
	}
	return n
}

// play runs one scenario against one proxy and records what it saw; in a
// warm play (warm), every request to the app goes on a client connection
// that served a request before, and so finds the proxy's connection to the
// app pooled. The app's port, which differs between runs, reads
// {{USER_PORT}}, in field names (a metric's labels) as in values.
func play(sc Scenario, gen string, p proxy, warm bool, logs string) *Observation {
	obs := NewObservation()
	app, err := StartApp(sc.App)
	if err != nil {
		obs.Set("setup", err.Error())
		return obs
	}
	defer app.Stop()
	defer obs.Replace(strconv.Itoa(app.Port), "{{USER_PORT}}")
	env, err := defaultEnv(gen, app.Port)
	if err != nil {
		obs.Set("setup", err.Error())
		return obs
	}
	for k, v := range sc.Env {
		env[k] = strings.ReplaceAll(v, "{{USER_PORT}}", strconv.Itoa(app.Port))
	}
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	sort.Strings(vars)
	logFile, _ := os.Create(filepath.Join(logs, runName(sc.Name, gen, p.name, warm)+".log"))
	defer logFile.Close()
	cmd := exec.Command(p.bin)
	cmd.Env = vars
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		obs.Set("setup", err.Error())
		return obs
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		waitFree()
	}()
	// Every port a step asks is listened on before the first step: the Go
	// queue-proxy starts its servers one by one, so the stats and metrics
	// ports can come a moment after the main one.
	if !waitListening(8012, exited) || !waitListening(8022, exited) || !waitListening(9090, exited) ||
		sc.TLS && !waitListening(8112, exited) || readsMetrics(&sc) && !waitListening(9091, exited) {
		obs.Set("start", "did not listen")
		return obs
	}
	app.Begin()

	started := map[string]chan exchange{}
	// Requests answered on the main port so far, which the request
	// metrics must count before a metrics step reads them.
	answered := 0
	var lastSignal time.Time
	var mu sync.Mutex
	for i, step := range sc.Steps {
		name := step.Name
		if name == "" {
			name = fmt.Sprintf("step%d", i+1)
		}
		prefix := name + "."
		switch {
		case step.Request != nil:
			e := do(step.Request, warm)
			e.into(prefix, obs)
			answered += answeredOnMain(step.Request, e)
			describeSeen(prefix, app.Take(), obs)
		case step.Parallel != nil:
			results := make([]string, len(step.Parallel))
			// Each request's connection is opened (in a warm play, and
			// has served its first request) one after the other; then
			// all the requests go at once.
			conns := make([]*clientConn, len(step.Parallel))
			exchanges := make([]exchange, len(step.Parallel))
			for j := range step.Parallel {
				exchanges[j] = exchange{}
				conns[j] = open(&step.Parallel[j], warm, exchanges[j])
				answered += answeredOnMain(&step.Parallel[j], exchange{"status": exchanges[j]["warmup"]})
			}
			var wg sync.WaitGroup
			for j := range step.Parallel {
				wg.Add(1)
				go func(j int) {
					defer wg.Done()
					e := doOn(&step.Parallel[j], conns[j], exchanges[j])
					results[j] = fmt.Sprintf("%s %s %s", e["status"], e["body"], e["response"])
				}(j)
			}
			wg.Wait()
			counts := map[string]int{}
			for _, r := range results {
				counts[r]++
			}
			for outcome, n := range counts {
				obs.Set(prefix+"outcome["+outcome+"]", strconv.Itoa(n))
			}
			obs.Set(prefix+"app.requests", strconv.Itoa(len(app.Take())))
		case step.Start != nil:
			ch := make(chan exchange, 1)
			started[step.Start.As] = ch
			req := step.Start
			go func() { ch <- do(req, warm) }()
			// The request is under way once the app has it, or the proxy
			// has queued it; give it the moment a client would.
			waitArrived(app, req)
		case step.Await != "":
			e := <-started[step.Await]
			e.into(prefix, obs)
		case step.Signal != "":
			mu.Lock()
			lastSignal = time.Now()
			mu.Unlock()
			sig := syscall.SIGTERM
			if step.Signal == "INT" {
				sig = syscall.SIGINT
			}
			cmd.Process.Signal(sig)
			obs.Set(prefix+"signal", step.Signal)
		case step.Exit:
			select {
			case <-exited:
				obs.Set(prefix+"exit", cmd.ProcessState.String())
				obs.Set(prefix+"after-signal", timing(time.Since(lastSignal)))
			case <-time.After(75 * time.Second):
				obs.Set(prefix+"exit", "still running after 75 s")
			}
		case step.Stats:
			statFields().into(prefix, obs)
		case step.Metrics:
			metricsFields(gen, answered).into(prefix, obs)
		case step.WebSocket != "":
			doWebSocket(step.WebSocket, warm).into(prefix, obs)
			describeSeen(prefix, app.Take(), obs)
		}
	}
	return obs
}

// waitArrived waits until a background request has reached the app (or
// 300 ms pass, for one the proxy holds back).
func waitArrived(app *App, req *Request) {
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		app.mu.Lock()
		n := len(app.seen)
		app.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitListening(port int, exited chan struct{}) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// readsMetrics says whether a step of sc asks the metrics port.
func readsMetrics(sc *Scenario) bool {
	for _, step := range sc.Steps {
		if step.Metrics {
			return true
		}
		for _, r := range step.Parallel {
			if r.Port == "metrics" {
				return true
			}
		}
		for _, r := range []*Request{step.Request, step.Start} {
			if r != nil && r.Port == "metrics" {
				return true
			}
		}
	}
	return false
}

// waitFree waits until the fixed ports are free again for the next run.
func waitFree() {
	for _, port := range []int{8012, 8022, 9090, 9091} {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
			if err == nil {
				l.Close()
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// nameMatches says whether a scenario or case named name is one -only
// selects: all of them when it is empty.
func nameMatches(name, only string) bool {
	if only == "" {
		return true
	}
	matched, err := regexp.MatchString(only, name)
	return err == nil && matched
}
