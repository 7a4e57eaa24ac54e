package main

import (
	"bufio"
	"strings"
	"testing"
)

// read runs the app's strict reader over raw.
func read(raw string) (*wireRequest, error) {
	req := &wireRequest{}
	err := readH1(bufio.NewReader(strings.NewReader(raw)), req, func() {})
	return req, err
}

func TestTheAppReadsStrictHTTP(t *testing.T) {
	for _, c := range []struct {
		raw, body, violation string
		complete             bool
	}{
		{"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", "hello", "", true},
		{"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;e=1\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n", "hello", "", true},
		{"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", "", "", true},
		// Cut short: not complete, no violation.
		{"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhel", "hel", "", false},
		{"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "hello", "", false},
		{"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", "hello", "", false},
		// What no strict reader takes.
		{"POST /a HTTP/1.1\nHost: x\r\n\r\n", "", "a line ending in a bare LF", false},
		{"POST /a HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", "", "an obs-folded line", false},
		{"POST /a HTTP/1.1\r\nHost : x\r\n\r\n", "", "a field line that is not name: value (\"Host : x\")", false},
		{"POST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "", "Content-Length with Transfer-Encoding", false},
		{"POST /a HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "", "Content-Length twice", false},
		{"POST /a HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", "", "Content-Length \"+5\"", false},
		{"POST /a HTTP/1.1\r\nTransfer-Encoding: identity, chunked\r\n\r\n", "", "Transfer-Encoding \"identity, chunked\"", false},
		{"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "", "Transfer-Encoding twice", false},
		{"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "", "a chunk size line \"zz\"", false},
		{"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n", "hello", "chunk data longer than its size", false},
		{"POST /a HTTP/1.0\r\n\r\n", "", "a request line \"POST /a HTTP/1.0\"", false},
	} {
		req, err := read(c.raw)
		violation := ""
		if v, ok := err.(errViolation); ok {
			violation = string(v)
		}
		if violation != c.violation || req.Complete != c.complete || string(req.Body) != c.body {
			t.Errorf("%q: violation %q, complete %v, body %q; want %q, %v, %q", c.raw, violation, req.Complete, req.Body, c.violation, c.complete, c.body)
		}
	}
}

// played is a case's result with the client's outcome and what the app
// got, the proxy serving the next request as it should.
func played(client clientSaw, app ...*wireRequest) *caseResult {
	return &caseResult{Client: client, App: app, Next: "200 ok"}
}

func TestTheInvariantIsJudgedAsWritten(t *testing.T) {
	c := &integCase{Kind: "request", Sent: map[string]sentRequest{"/a": {Method: "POST", Body: "hello"}}}
	whole := &wireRequest{Method: "POST", Target: "/a", Body: []byte("hello"), Complete: true}
	ok := clientSaw{Responses: []clientResponse{{Status: 200, Whole: true}}}
	failed := clientSaw{Responses: []clientResponse{{Status: 502, Whole: true}}}
	if b := breaches(c, played(ok, whole)); len(b) != 0 {
		t.Errorf("a request delivered whole and answered: %v", b)
	}
	short := &wireRequest{Method: "POST", Target: "/a", Body: []byte("hel"), Complete: true}
	if b := breaches(c, played(failed, short)); len(b) != 1 {
		t.Errorf("a request delivered with other bytes: %v", b)
	}
	broken := &integCase{Kind: "request"}
	empty := &wireRequest{Method: "POST", Target: "/a", Complete: true}
	if b := breaches(broken, played(ok, empty)); len(b) != 2 {
		t.Errorf("a broken request delivered complete and answered 200: %v", b)
	}
	unfinished := &wireRequest{Method: "POST", Target: "/a"}
	if b := breaches(broken, played(failed, unfinished)); len(b) != 0 {
		t.Errorf("a broken request left unfinished, answered 502: %v", b)
	}
	if b := breaches(broken, played(ok, unfinished)); len(b) != 1 {
		t.Errorf("a broken request left unfinished, answered 200: %v", b)
	}
	left := played(failed, unfinished)
	left.LeftPartial = true
	if b := breaches(broken, left); len(b) != 1 {
		t.Errorf("an app connection left holding part of a request: %v", b)
	}
	poisoned := played(failed, unfinished)
	poisoned.Next = "502 \"EOF\""
	if b := breaches(broken, poisoned); len(b) != 1 {
		t.Errorf("the next request failing: %v", b)
	}
	response := &integCase{Kind: "response", Sent: map[string]sentRequest{"/r/x": {Method: "GET"}}}
	get := &wireRequest{Method: "GET", Target: "/r/x", Complete: true}
	broke := played(ok, get)
	broke.Logged = []string{"RL /r/x 500 0"}
	if b := breaches(response, broke); len(b) != 1 {
		t.Errorf("a broken response reaching the client whole: %v", b)
	}
}

func TestQproxyMayRefuseWhatGoDeliversButNotDeliverMore(t *testing.T) {
	c := &integCase{Kind: "smuggling"}
	req := func(target string) *wireRequest {
		return &wireRequest{Method: "GET", Target: target, Complete: true}
	}
	both := &caseResult{App: []*wireRequest{req("/1"), req("/2")}}
	first := &caseResult{App: []*wireRequest{req("/1")}}
	none := &caseResult{}
	if l := laxer(c, both, first); len(l) != 0 {
		t.Errorf("a refusal after the first: %v", l)
	}
	if l := laxer(c, both, none); len(l) != 0 {
		t.Errorf("a refusal: %v", l)
	}
	if l := laxer(c, first, both); len(l) != 1 {
		t.Errorf("more than Go: %v", l)
	}
	if l := laxer(c, none, first); len(l) != 1 {
		t.Errorf("what Go refused: %v", l)
	}
}

func TestEveryCaseHasAUniqueNameAndAWayToBeSent(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range integCases() {
		if seen[c.Name] {
			t.Errorf("%s twice", c.Name)
		}
		seen[c.Name] = true
		if (c.Proto == "h2") != (c.H2 != nil) || c.Proto == "h1" && (len(c.Writes) == 0 || c.Responses == 0) {
			t.Errorf("%s: nothing to send", c.Name)
		}
		if c.Early != (strings.Contains(c.Name, "early")) {
			t.Errorf("%s: early %v", c.Name, c.Early)
		}
	}
}
