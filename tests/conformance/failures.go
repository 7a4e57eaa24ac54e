package main

// The failure-mode suite (`go run . -failures`): the ways Knative's users
// report the Go queue-proxy failing them when the app or the rollout
// misbehaves, each played against the Go queue-proxy and qproxy with the
// same app and the same clients, counting what the clients see. A case
// fails the run when qproxy fails more requests than Go, fails a request
// whose bytes never reached the app, or breaks a rule of its own (an app
// that announces its keep-alive timeout: no failure at all).
//
// Each play runs in a child process in a network namespace of its own, as
// the conformance scenarios do (isolate.go), all at once: the cases are
// mostly waiting (an app's idle timer, a drain).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// failChildFlag names the hidden flag a child play of a failure case is
// started with.
const failChildFlag = "fail-in-namespace"

// Counts is what a play of a failure case counted. Keys that start with
// "failed" count failures (qproxy's may not exceed Go's); the others
// describe.
type Counts map[string]int

// failCase is one failure mode, as Knative's users reported it.
type failCase struct {
	Name string
	// Issues are knative/serving's issue numbers it reproduces.
	Issues string
	// What the case does, for the report.
	What string
	// Generations it is played in: the app's side of the proxy is the
	// same in both, so most cases need only one.
	Generations []string
	// Env is set over the generation's default environment.
	Env map[string]string
	// QproxyZero lists counts that must be zero with qproxy.
	QproxyZero []string
	// Play runs the case: the app is started before the proxy (its port
	// in the environment), the clients once the proxy listens.
	Play func(p *failPlay)
}

// failPlay is one play of a case against one proxy.
type failPlay struct {
	gen, proxy string
	cmd        *exec.Cmd
	exited     chan struct{}
	log        string
	counts     Counts
	mu         sync.Mutex
	// AppPort is the app's port, set by the case's app before the proxy
	// starts.
	appPort int
	// start starts the proxy, once the app listens.
	start func() error
}

// add adds n to the count `name`.
func (p *failPlay) add(name string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[name] += n
}

// set sets the count `name`.
func (p *failPlay) set(name string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[name] = n
}

// Start starts the proxy with the app on port, and waits until it listens.
func (p *failPlay) Start(port int) error {
	p.appPort = port
	return p.start()
}

// Signal sends sig to the proxy.
func (p *failPlay) Signal(sig syscall.Signal) {
	p.cmd.Process.Signal(sig)
}

// WaitExit waits up to `limit` for the proxy to exit, and says whether it
// did.
func (p *failPlay) WaitExit(limit time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(limit):
		return false
	}
}

// ErrorLines counts the proxy's log lines at level error so far.
func (p *failPlay) ErrorLines() int {
	raw, _ := os.ReadFile(p.log)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"severity":"ERROR"`) || strings.Contains(line, `"level":"error"`) {
			n++
		}
	}
	return n
}

// playFailure plays c against one proxy, here, and returns its counts.
func playFailure(c failCase, gen string, pr proxy, logs string) Counts {
	p := &failPlay{gen: gen, proxy: pr.name, counts: Counts{}, exited: make(chan struct{})}
	p.log = filepath.Join(logs, "failures."+c.Name+"."+gen+"."+pr.name+".log")
	p.start = func() error {
		env, err := defaultEnv(gen, p.appPort)
		if err != nil {
			return err
		}
		for k, v := range c.Env {
			env[k] = v
		}
		var vars []string
		for k, v := range env {
			vars = append(vars, k+"="+v)
		}
		sort.Strings(vars)
		logFile, err := os.Create(p.log)
		if err != nil {
			return err
		}
		p.cmd = exec.Command(pr.bin)
		p.cmd.Env = vars
		p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
		if err := p.cmd.Start(); err != nil {
			return err
		}
		go func() { p.cmd.Wait(); logFile.Close(); close(p.exited) }()
		for _, port := range []int{8012, 8022} {
			if !waitListening(port, p.exited) {
				return fmt.Errorf("%s did not listen on %d", pr.name, port)
			}
		}
		return nil
	}
	defer func() {
		if p.cmd != nil && p.cmd.Process != nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
	}()
	c.Play(p)
	return p.counts
}

// failChild is what a child play of a failure case is asked to play.
type failChild struct {
	Case  string `json:"case"`
	Gen   string `json:"gen"`
	Proxy string `json:"proxy"`
	Bin   string `json:"bin"`
	Logs  string `json:"logs"`
}

// playFailureIsolated plays c against one proxy in a child process in a
// network namespace of its own.
func playFailureIsolated(c failCase, gen string, pr proxy, logs string) (Counts, error) {
	var counts Counts
	err := inNamespace(failChildFlag, failChild{c.Name, gen, pr.name, pr.bin, logs}, &counts)
	return counts, err
}

// runFailChild is the child's side of playFailureIsolated.
func runFailChild(arg string) int {
	return childSide("failures", arg, func(c failChild) (any, error) {
		fc, ok := findFailCase(c.Case)
		if !ok {
			return nil, fmt.Errorf("no case %s", c.Case)
		}
		return playFailure(fc, c.Gen, proxy{c.Proxy, c.Bin}, c.Logs), nil
	})
}

func findFailCase(name string) (failCase, bool) {
	for _, c := range failCases() {
		if c.Name == name {
			return c, true
		}
	}
	return failCase{}, false
}

// failResult is a case's counts in one generation, with each proxy.
type failResult struct {
	c          failCase
	gen        string
	goCounts   Counts
	qCounts    Counts
	err        error
	violations []string
}

// judge says what of qproxy's counts breaks the suite's rules.
func (r *failResult) judge() {
	if r.err != nil {
		r.violations = append(r.violations, r.err.Error())
		return
	}
	var keys []string
	for k := range r.qCounts {
		keys = append(keys, k)
	}
	for k := range r.goCounts {
		if _, ok := r.qCounts[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, "failed") && r.qCounts[k] > r.goCounts[k] {
			r.violations = append(r.violations, fmt.Sprintf("%s: qproxy %d, Go %d", k, r.qCounts[k], r.goCounts[k]))
		}
	}
	for _, k := range append([]string{"failed.never-arrived"}, r.c.QproxyZero...) {
		if r.qCounts[k] != 0 {
			r.violations = append(r.violations, fmt.Sprintf("%s: qproxy %d, must be 0", k, r.qCounts[k]))
		}
	}
}

// runFailures plays every failure case (or those whose name matches
// only) against both proxies, writes the report, and says whether the
// suite passed.
func runFailures(generations []Generation, bin, logs, report, only string, isolate bool) bool {
	var results []*failResult
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range failCases() {
		if only != "" && !nameMatches(c.Name, only) {
			continue
		}
		for _, g := range generations {
			if !contains(c.Generations, g.Name) {
				continue
			}
			r := &failResult{c: c, gen: g.Name}
			results = append(results, r)
			play := func(pr proxy, into *Counts) {
				if !isolate {
					*into = playFailure(c, g.Name, pr, logs)
					return
				}
				counts, err := playFailureIsolated(c, g.Name, pr, logs)
				if err != nil {
					r.err = err
				}
				*into = counts
			}
			if !isolate {
				play(proxy{"go", g.Oracle}, &r.goCounts)
				play(proxy{"qproxy", bin}, &r.qCounts)
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); play(proxy{"go", g.Oracle}, &r.goCounts) }()
			go func() { defer wg.Done(); play(proxy{"qproxy", bin}, &r.qCounts) }()
		}
	}
	wg.Wait()
	var out strings.Builder
	fmt.Fprintf(&out, "# Failure modes: qproxy against Knative's Go queue-proxy\n\n")
	fmt.Fprintf(&out, "Run %s, %s; qproxy `%s`.\n\n", time.Now().UTC().Format(time.RFC3339), time.Since(start).Round(time.Second), bin)
	fmt.Fprintf(&out, "| case | issues | generation | failed: Go | failed: qproxy | Go | qproxy | verdict |\n|---|---|---|---|---|---|---|---|\n")
	failed := 0
	for _, r := range results {
		r.judge()
		verdict := "ok"
		if len(r.violations) > 0 {
			verdict = "**FAILS**: " + strings.Join(r.violations, "; ")
			failed++
		}
		fmt.Fprintf(&out, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.c.Name, r.c.Issues, r.gen,
			ratio(r.goCounts), ratio(r.qCounts), detail(r.goCounts), detail(r.qCounts), verdict)
	}
	fmt.Fprintf(&out, "\nWhat each case does:\n\n")
	for _, c := range failCases() {
		if only != "" && !nameMatches(c.Name, only) {
			continue
		}
		fmt.Fprintf(&out, "- `%s` (%s): %s\n", c.Name, c.Issues, c.What)
	}
	fmt.Fprintf(&out, "\n%d cases played, %d failing.\n", len(results), failed)
	os.MkdirAll(filepath.Dir(report), 0o755)
	os.WriteFile(report, []byte(out.String()), 0o644)
	fmt.Print(out.String())
	return failed == 0
}

// ratio is "failed of sent" for the report.
func ratio(c Counts) string {
	if c == nil {
		return "—"
	}
	failed := 0
	for k, v := range c {
		if k == "failed" {
			failed = v
		}
	}
	return fmt.Sprintf("%d of %d", failed, c["sent"])
}

// detail lists a play's other counts, for the report.
func detail(c Counts) string {
	var parts []string
	for k, v := range c {
		if k == "failed" || k == "sent" || v == 0 {
			continue
		}
		parts = append(parts, k+" "+strconv.Itoa(v))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
