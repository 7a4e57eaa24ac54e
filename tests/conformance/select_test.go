package main

import "testing"

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
