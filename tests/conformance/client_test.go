package main

import "testing"

func TestCountedAllSumsEachCounterOverItsLabels(t *testing.T) {
	text := `# TYPE revision_request_count counter
revision_request_count{response_code="200"} 1
revision_request_count{response_code="503"} 1
revision_request_latencies_count{response_code="200"} 1
revision_app_request_count{response_code="200"} 1
`
	counters := []string{"revision_request_count", "revision_app_request_count"}
	if countedAll(text, counters, 2) {
		t.Error("revision_app_request_count has counted one request of two, yet countedAll says all are counted")
	}
	if !countedAll(text+`revision_app_request_count{response_code="503"} 1`+"\n", counters, 2) {
		t.Error("both counters sum to 2, yet countedAll says not")
	}
	if !countedAll(text+`revision_app_request_count{response_code="503"} 2`+"\n", counters, 2) {
		t.Error("a count past the requests answered (a request the runner did not count) is still all of them")
	}
	if countedAll("", counters, 1) {
		t.Error("an empty exposition counts nothing")
	}
	if !countedAll("", counters, 0) {
		t.Error("no request answered needs no sample")
	}
}
