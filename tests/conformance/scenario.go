package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Scenario is one file of scenarios/: an environment, an app, and steps.
type Scenario struct {
	Name        string `yaml:"-"`
	Description string `yaml:"description"`
	// Generations it is played in: classic, current, or (when empty) both.
	Generations []string          `yaml:"generations"`
	Env         map[string]string `yaml:"env"`
	// TLS mounts a certificate where Knative mounts it,
	// /var/lib/knative/certs, for both proxies: each run in a mount
	// namespace of its own (so only with isolated runs).
	TLS   bool      `yaml:"tls"`
	App   AppConfig `yaml:"app"`
	Steps []Step    `yaml:"steps"`
}

// Step is one thing the runner does. Exactly one of its actions is set.
type Step struct {
	// Name labels the step's fields in the report (default: step<N>).
	Name string `yaml:"name"`

	// Request sends one request and records the response, what the app got,
	// the timing class and what became of the connection.
	Request *Request `yaml:"request"`
	// Parallel sends these requests at once, each on its own connection,
	// and records the multiset of outcomes (order of arrival is not
	// observable).
	Parallel []Request `yaml:"parallel"`
	// Start sends a request in the background; Await collects it.
	Start *Request `yaml:"start"`
	Await string   `yaml:"await"`
	// Signal sends a signal (TERM, INT) to the proxy.
	Signal string `yaml:"signal"`
	// Exit waits for the proxy to exit and records its status and how long
	// after the last signal it exited.
	Exit bool `yaml:"exit"`
	// Stats reads the autoscaler's Stat from :9090 once a report with a
	// request in it is out (or 3 s have passed).
	Stats bool `yaml:"stats"`
	// Metrics reads :9091/metrics once the request counters have counted
	// every request answered on the main port so far (or 3 s have passed).
	Metrics bool `yaml:"metrics"`
	// WebSocket opens a WebSocket to path, echoes a message and closes.
	WebSocket string `yaml:"websocket"`
}

// Request is one HTTP exchange.
type Request struct {
	// Port: main (default), tls, admin, stats or metrics.
	Port string `yaml:"port"`
	// Proto: h1 (default), h2 (prior knowledge; h2c without TLS), or raw
	// (Raw written as is; the answer read until the connection closes or
	// 3 s pass).
	Proto string `yaml:"proto"`
	// TLS speaks TLS on the connection, with a client that verifies the
	// mounted certificate; the handshake's outcome is recorded as tls.*.
	TLS     *TLSClient `yaml:"tls"`
	Method  string     `yaml:"method"`
	Path    string     `yaml:"path"`
	Headers [][]string `yaml:"headers"`
	Body    string     `yaml:"body"`
	Raw     string     `yaml:"raw"`
	// Until repeats the request (up to 5 s) until it answers this status.
	Until int `yaml:"until"`
	// NoReuse skips the keep-alive check after the response.
	NoReuse bool `yaml:"no_reuse"`
	// As names a started request for Await.
	As string `yaml:"as"`
}

// TLSClient is what a TLS client offers.
type TLSClient struct {
	// ALPN protocols offered, in order (none when empty).
	ALPN []string `yaml:"alpn"`
	// Min and Max bound the versions offered: "1.2" or "1.3" (Go's
	// client defaults when empty).
	Min string `yaml:"min"`
	Max string `yaml:"max"`
}

// In says whether the scenario is played in generation gen.
func (s *Scenario) In(gen string) bool {
	return len(s.Generations) == 0 || slices.Contains(s.Generations, gen)
}

// LoadScenarios reads every *.yaml of dir, in name order.
func LoadScenarios(dir string) ([]Scenario, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Scenario
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var sc Scenario
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		if err := dec.Decode(&sc); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		sc.Name = strings.TrimSuffix(filepath.Base(f), ".yaml")
		for _, g := range sc.Generations {
			if g != "classic" && g != "current" {
				return nil, fmt.Errorf("%s: no generation %q (classic or current)", f, g)
			}
		}
		if len(sc.Steps) == 0 {
			return nil, fmt.Errorf("%s: no steps", f)
		}
		out = append(out, sc)
	}
	return out, nil
}

// Observation is every field a run recorded, by name.
type Observation struct {
	fields map[string]string
	order  []string
}

func NewObservation() *Observation { return &Observation{fields: map[string]string{}} }

// Replace replaces old with new in every field's name and value.
func (o *Observation) Replace(old, new string) {
	fields := make(map[string]string, len(o.fields))
	for i, n := range o.order {
		renamed := strings.ReplaceAll(n, old, new)
		fields[renamed] = strings.ReplaceAll(o.fields[n], old, new)
		o.order[i] = renamed
	}
	o.fields = fields
}

func (o *Observation) Set(name, value string) {
	if _, ok := o.fields[name]; !ok {
		o.order = append(o.order, name)
	}
	o.fields[name] = value
}

// Difference is one known difference between qproxy and Knative's Go
// queue-proxy, explained, and where the scenarios see it.
type Difference struct {
	ID    string `yaml:"id"`
	Area  string `yaml:"area"`
	Title string `yaml:"title"`
	Text  string `yaml:"text"`
	// Observed lists the fields of the scenarios that see it.
	Observed []*Expected `yaml:"observed"`
}

// Expected is one place a known difference is seen: a scenario's fields.
type Expected struct {
	Scenario string `yaml:"scenario"`
	// Field is a pattern over field names, where * stands for any run of
	// characters.
	Field string `yaml:"field"`
	// Sometimes marks a race: the difference shows in some runs only, so
	// a run without it does not make the entry stale.
	Sometimes bool `yaml:"sometimes"`
	// Generations it is seen in: classic, current, or (when empty) both.
	Generations []string `yaml:"generations"`
	// Paths it is seen on: cold, warm, or (when empty) both; an entry
	// seen on one path only says why in its difference's text.
	Paths []string `yaml:"paths"`
	// Why is the difference seen there, set when loaded.
	Why *Difference `yaml:"-"`
	// used records the generations and paths ("classic warm") it
	// explained a difference in.
	used map[string]bool
}

// Matches says whether the field named name is one the entry names.
func (e *Expected) Matches(name string) bool {
	parts := strings.Split(e.Field, "*")
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	rest := name[len(parts[0]):]
	for i, part := range parts[1:] {
		if i == len(parts)-2 {
			return strings.HasSuffix(rest, part)
		}
		at := strings.Index(rest, part)
		if at < 0 {
			return false
		}
		rest = rest[at+len(part):]
	}
	return rest == ""
}

// AppliesTo says whether the entry explains differences in generation gen
// on path (cold or warm).
func (e *Expected) AppliesTo(gen, path string) bool {
	return (len(e.Generations) == 0 || slices.Contains(e.Generations, gen)) &&
		(len(e.Paths) == 0 || slices.Contains(e.Paths, path))
}

// LoadDifferences reads the list of known differences.
func LoadDifferences(file string) ([]*Difference, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []*Difference
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&out); err != nil && err.Error() != "EOF" {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	ids := map[string]bool{}
	for _, d := range out {
		if d.ID == "" || d.Area == "" || d.Title == "" || strings.TrimSpace(d.Text) == "" {
			return nil, fmt.Errorf("%s: every difference needs an id, an area, a title and a text", file)
		}
		if ids[d.ID] {
			return nil, fmt.Errorf("%s: difference %s is listed twice", file, d.ID)
		}
		ids[d.ID] = true
		for _, e := range d.Observed {
			if e.Scenario == "" || e.Field == "" {
				return nil, fmt.Errorf("%s: %s: every observed entry needs a scenario and a field", file, d.ID)
			}
			for _, g := range e.Generations {
				if g != "classic" && g != "current" {
					return nil, fmt.Errorf("%s: %s: no generation %q (classic or current)", file, d.ID, g)
				}
			}
			for _, p := range e.Paths {
				if p != "cold" && p != "warm" {
					return nil, fmt.Errorf("%s: %s: no path %q (cold or warm)", file, d.ID, p)
				}
			}
			e.Why = d
			e.used = map[string]bool{}
		}
	}
	return out, nil
}

// Expectations are the observed entries of every difference.
func Expectations(differences []*Difference) []*Expected {
	var out []*Expected
	for _, d := range differences {
		out = append(out, d.Observed...)
	}
	return out
}
