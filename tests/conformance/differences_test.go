package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// The page of known differences is what expected.yaml makes of it, so the
// two cannot disagree.
func TestDifferencesPageIsGeneratedFromExpected(t *testing.T) {
	differences, err := LoadDifferences("expected.yaml")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../../docs/differences.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(page) != RenderDifferences(differences) {
		t.Fatal("docs/differences.md is not what expected.yaml makes: run `go run . -differences ../../docs/differences.md` here")
	}
}

// Every observed entry names a scenario there is.
func TestObservedScenariosExist(t *testing.T) {
	differences, err := LoadDifferences("expected.yaml")
	if err != nil {
		t.Fatal(err)
	}
	scenarios, err := LoadScenarios("scenarios")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkScenarios(Expectations(differences), scenarios); err != nil {
		t.Fatal(err)
	}
}

// A field pattern's * stands for any run of characters, slashes included
// (a metric's labels hold them).
func TestFieldPatterns(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"step1.bytes", "step1.bytes", true},
		{"step1.bytes", "step1.bytes.x", false},
		{"step1.*", "step1.body.end", true},
		{"step1.app*", "step1.app[0].host", true},
		{"step1.app*", "step2.app", false},
		{"metrics.sample.go_*", `metrics.sample.go_info{scope="go.io/x/runtime"}`, true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"*.Date", "step1.header.Date", true},
	} {
		e := &Expected{Field: c.pattern}
		if got := e.Matches(c.name); got != c.want {
			t.Errorf("%q on %q: %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

// The project's pages count the scenarios there are, and those over TLS.
func TestPagesCountTheScenarios(t *testing.T) {
	scenarios, err := LoadScenarios("scenarios")
	if err != nil {
		t.Fatal(err)
	}
	tls := 0
	for _, s := range scenarios {
		if s.TLS {
			tls++
		}
	}
	counts := map[string][]string{
		"../../README.md": {
			fmt.Sprintf("queue-proxy: %d scenarios (%d over TLS)", len(scenarios), tls),
			fmt.Sprintf("the differential suite: %d scenarios", len(scenarios)),
		},
		"../../CONTRIBUTING.md": {fmt.Sprintf("plays %d scenarios", len(scenarios))},
	}
	for page, wants := range counts {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		// However the lines are wrapped.
		words := strings.Join(strings.Fields(string(text)), " ")
		for _, want := range wants {
			if !strings.Contains(words, want) {
				t.Errorf("%s does not say %q", page, want)
			}
		}
	}
}
