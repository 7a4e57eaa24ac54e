package main

import (
	"strings"
	"testing"
)

func TestOnlySelectsByRegularExpression(t *testing.T) {
	for _, c := range []struct {
		name, only string
		want       bool
	}{
		{"040-drain-sigterm", "", true},
		{"040-drain-sigterm", "drain", true},
		{"128-tls-drain", "^0", false},
		{"093-h2c-plain", "^(001|093)-", true},
		{"0930-other", "^(001|093)-", false},
		{"040-drain-sigterm", "(", false},
	} {
		if got := nameMatches(c.name, c.only); got != c.want {
			t.Errorf("nameMatches(%q, %q) = %v, want %v", c.name, c.only, got, c.want)
		}
	}
}

func TestEmulatedRunsDoNotCompareWallClockClasses(t *testing.T) {
	a, b := NewObservation(), NewObservation()
	for _, o := range []*Observation{a, b} {
		o.Set("step1.status", "200")
	}
	a.Set("step1.timing", "immediate")
	b.Set("step1.timing", "~1s")
	a.Set("exit.after-signal", "~30s")
	b.Set("exit.after-signal", "~35s")
	a.Set("step1.body", `"hello\n"`)
	b.Set("step1.body", `"hullo\n"`)
	verdicts := func() map[string]string {
		out := map[string]string{}
		for _, r := range compare("x", "current", "cold", a, b, nil) {
			out[r.field] = strings.SplitN(r.verdict, " ", 2)[0]
		}
		return out
	}
	defer func() { clockNotCompared = false }()
	for _, c := range []struct {
		emulated    bool
		timing, end string
	}{{false, "DIFFERS", "DIFFERS"}, {true, "unclocked", "unclocked"}} {
		clockNotCompared = c.emulated
		v := verdicts()
		if v["step1.timing"] != c.timing || v["exit.after-signal"] != c.end || v["step1.body"] != "DIFFERS" || v["step1.status"] != "same" {
			t.Errorf("emulated %v: %v", c.emulated, v)
		}
	}
}
