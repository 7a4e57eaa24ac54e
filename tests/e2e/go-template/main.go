// Renders each template of cases.json with Go's text/template over
// Knative-shaped request-log data, and prints one JSON object per case:
// whether it parsed, whether it ran, and the bytes it wrote (hex).
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"text/template"
)

type revision struct {
	Name, Namespace, Service, Configuration, PodName, PodIP string
}

type response struct {
	Code    int
	Size    int
	Latency float64
}

type input struct {
	Request  *http.Request
	Response *response
	Revision *revision
	TraceID  string
}

type result struct {
	Parsed bool   `json:"parsed"`
	Ran    bool   `json:"ran"`
	Out    string `json:"out"`
}

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var cases []string
	if err := json.Unmarshal(raw, &cases); err != nil {
		panic(err)
	}
	u, _ := url.ParseRequestURI("/path/a%20b?q=a&b=<c>")
	data := &input{
		Request: &http.Request{
			Method:     "POST",
			RequestURI: "/path/a%20b?q=a&b=<c>",
			URL:        u,
			Proto:      "HTTP/1.1",
			ProtoMajor: 1,
			ProtoMinor: 1,
			Header: http.Header{
				"User-Agent":   {"curl/8.0 \"x\" <y>"},
				"Referer":      {"http://ref/?a=b&c='d'"},
				"X-B3-Traceid": {"abc123"},
				"Accept":       {"text/plain", "*/*"},
				"X-Bin":        {"caf\xc3\xa9 \xff \u2028 \u00a0 \t\x01 ok"},
			},
			ContentLength: 42,
			Host:          "example.com",
			RemoteAddr:    "10.0.0.1:5555",
		},
		Response: &response{Code: 200, Size: 1234, Latency: 0.001234567},
		Revision: &revision{"rev-1", "ns", "svc", "cfg", "pod-1", "10.0.0.2"},
		TraceID:  "0af7651916cd43dd8448eb211c80319c",
	}
	var results []result
	for _, c := range cases {
		var r result
		t, err := template.New("t").Parse(c)
		if err == nil {
			r.Parsed = true
			var b writer
			err = t.Execute(&b, data)
			r.Ran = err == nil
			r.Out = hex.EncodeToString(b)
		}
		results = append(results, r)
	}
	out, _ := json.Marshal(results)
	fmt.Println(string(out))
}

type writer []byte

func (w *writer) Write(p []byte) (int, error) {
	*w = append(*w, p...)
	return len(p), nil
}
