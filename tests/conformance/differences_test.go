package main

import (
	"os"
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
