// Command failcompare compares what the in-cluster failure-mode tests
// (failures_test.go) counted with Knative's Go queue-proxy and with qproxy:
// it prints each test's counts side by side, as a Markdown table, and exits
// 1 if qproxy failed more requests of a kind than Go.
//
//	go run ./failcompare GO-DIR QPROXY-DIR
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: failcompare GO-DIR QPROXY-DIR")
		os.Exit(2)
	}
	goCounts, err := load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "failcompare:", err)
		os.Exit(2)
	}
	qCounts, err := load(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "failcompare:", err)
		os.Exit(2)
	}
	rows, worse := compare(goCounts, qCounts)
	fmt.Println("| test | count | Go | qproxy |")
	fmt.Println("|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
	if len(worse) > 0 {
		fmt.Println()
		for _, w := range worse {
			fmt.Println("qproxy failed more than Go:", w)
		}
		os.Exit(1)
	}
}

// load reads every TEST.json in dir: a test's counts by name.
func load(dir string) (map[string]map[string]int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		counts := map[string]int{}
		if err := json.Unmarshal(raw, &counts); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = counts
	}
	return out, nil
}

// compare makes a row per test and count, and lists the failure counts
// where qproxy's exceed Go's. A test one of them lacks compares as empty.
func compare(goCounts, qCounts map[string]map[string]int) (rows, worse []string) {
	tests := map[string]bool{}
	for t := range goCounts {
		tests[t] = true
	}
	for t := range qCounts {
		tests[t] = true
	}
	for _, t := range sorted(tests) {
		names := map[string]bool{}
		for n := range goCounts[t] {
			names[n] = true
		}
		for n := range qCounts[t] {
			names[n] = true
		}
		for _, n := range sorted(names) {
			g, q := goCounts[t][n], qCounts[t][n]
			rows = append(rows, fmt.Sprintf("| %s | %s | %d | %d |", t, n, g, q))
			if strings.HasPrefix(n, "failed") && q > g {
				worse = append(worse, fmt.Sprintf("%s %s: Go %d, qproxy %d", t, n, g, q))
			}
		}
	}
	return rows, worse
}

func sorted(set map[string]bool) []string {
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
