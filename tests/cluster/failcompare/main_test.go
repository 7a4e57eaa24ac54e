package main

import (
	"reflect"
	"testing"
)

func TestOnlyFailureCountsAboveGosFail(t *testing.T) {
	goCounts := map[string]map[string]int{
		"TestA": {"http.get": 100, "failed.http.get": 2},
		"TestB": {"failed.ws.cut": 1},
	}
	qCounts := map[string]map[string]int{
		"TestA": {"http.get": 120, "failed.http.get": 2, "failed.http.post": 1},
		"TestB": {},
	}
	rows, worse := compare(goCounts, qCounts)
	if len(rows) != 4 {
		t.Errorf("rows: %v", rows)
	}
	want := []string{"TestA failed.http.post: Go 0, qproxy 1"}
	if !reflect.DeepEqual(worse, want) {
		t.Errorf("worse: %v, want %v", worse, want)
	}
}
