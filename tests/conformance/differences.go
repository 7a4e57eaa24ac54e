package main

import (
	"fmt"
	"strings"
)

// checkScenarios fails when an observed entry names a scenario that does
// not exist.
func checkScenarios(expected []*Expected, scenarios []Scenario) error {
	names := map[string]bool{"*": true}
	for _, sc := range scenarios {
		names[sc.Name] = true
	}
	for _, e := range expected {
		if !names[e.Scenario] {
			return fmt.Errorf("expected.yaml: %s is observed in scenario %s, which does not exist", e.Why.ID, e.Scenario)
		}
	}
	return nil
}

// RenderDifferences writes the known differences as the Markdown page
// docs/differences.md, grouped by area in the order the areas first come.
func RenderDifferences(differences []*Difference) string {
	var b strings.Builder
	b.WriteString(`# Known differences from Knative's Go queue-proxy

<!-- Generated from tests/conformance/expected.yaml: edit that file, then
run ` + "`go run . -differences ../../docs/differences.md`" + ` in tests/conformance. -->

Where qproxy behaves differently from Knative's Go queue-proxy, as far as
is known: each difference is either on the way to being fixed or kept on
purpose, and says why. The differential suite
([tests/conformance](../tests/conformance/README.md)) plays its scenarios
against both, in each generation of Knative (classic: serving v0.42.2;
current: serving v0.50.0), and fails on any difference that is not listed
here; the differences it sees name the scenarios that see them.
`)
	var areas []string
	byArea := map[string][]*Difference{}
	for _, d := range differences {
		if _, ok := byArea[d.Area]; !ok {
			areas = append(areas, d.Area)
		}
		byArea[d.Area] = append(byArea[d.Area], d)
	}
	for _, area := range areas {
		fmt.Fprintf(&b, "\n## %s\n", area)
		for _, d := range byArea[area] {
			fmt.Fprintf(&b, "\n### %s\n\n%s\n", d.Title, wrap(strings.TrimSpace(d.Text), 76))
			if len(d.Observed) == 0 {
				continue
			}
			var seen []string
			for _, e := range d.Observed {
				when := ""
				if len(e.Generations) == 1 {
					when = ", " + e.Generations[0] + " Knative"
				}
				if len(e.Paths) == 1 {
					when += ", " + e.Paths[0] + " only"
				}
				if e.Sometimes {
					when += ", in some runs"
				}
				seen = append(seen, fmt.Sprintf("`%s` (`%s`%s)", e.Scenario, e.Field, when))
			}
			fmt.Fprintf(&b, "\n%s\n", wrap("Seen by the conformance suite in "+strings.Join(seen, ", ")+".", 76))
		}
	}
	return b.String()
}

// wrap fills text into lines of at most width characters, breaking only
// at spaces.
func wrap(text string, width int) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) > width:
			lines = append(lines, line)
			line = word
		default:
			line += " " + word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}
