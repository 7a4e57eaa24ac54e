package main

// The integrity suite's cases (integrity.go): request bodies broken by the
// client at many points, over HTTP/1.1 and HTTP/2; responses the app
// breaks; and the shapes of request smuggling.

import (
	"fmt"
	"hash/crc32"
	"strings"
)

// integCase is one thing a client does through the proxy.
type integCase struct {
	Name string
	// Kind: request (the client's body, broken or whole), response (the
	// app's answer, broken), or smuggling (framing that parsers read
	// differently).
	Kind string
	// Proto: h1 or h2.
	Proto string
	// Writes are the bytes an HTTP/1.1 client writes, one write each;
	// CloseWrite shuts its side after them.
	Writes     []string
	CloseWrite bool
	// Responses is how many answers an HTTP/1.1 client waits for.
	Responses int
	// H2 is what an HTTP/2 client sends.
	H2 *h2Plan
	// Sent are the requests the client sent whole, by target: what the app
	// may see complete, and only byte for byte.
	Sent map[string]sentRequest
	// Early: the app answers as soon as the head is in.
	Early bool
}

// sentRequest is a request the client sent whole.
type sentRequest struct {
	Method   string
	Body     string
	Trailers [][2]string
}

// h2Plan is an HTTP/2 request: its fields, its body (the first Cut bytes
// of Data sent), and how its stream ends: "end" (END_STREAM on the last
// DATA, or on HEADERS for no body), "trailers", "rst" (RST_STREAM CANCEL),
// "close" (the connection closed).
type h2Plan struct {
	Method   string
	Path     string
	Fields   [][2]string
	Data     string
	Cut      int
	End      string
	Trailers [][2]string
}

// bodySizes are the request body sizes every break is tried at: one byte,
// a body that fits a read, and one past qproxy's whole-body limit (64 KiB),
// streamed.
var bodySizes = []int{1, 1000, 100000}

// body is n bytes that say where they are.
func body(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%d,", i)
	}
	return b.String()[:n]
}

// crc names a body by its checksum, for a trailer.
func crc(s string) string { return fmt.Sprintf("%08x", crc32.ChecksumIEEE([]byte(s))) }

// head is an HTTP/1.1 request head to target with fields.
func head(method, target string, fields ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: example.com\r\n", method, target)
	for _, f := range fields {
		b.WriteString(f + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// chunks frames data in chunks of at most 4000 bytes, each size line
// with ext after it.
func chunks(data, ext string) []string {
	var out []string
	for len(data) > 0 {
		n := min(len(data), 4000)
		out = append(out, fmt.Sprintf("%x%s\r\n%s\r\n", n, ext, data[:n]))
		data = data[n:]
	}
	return out
}

// integCases are every case, in order.
func integCases() []integCase {
	var cases []integCase
	cases = append(cases, h1RequestCases()...)
	cases = append(cases, h2RequestCases()...)
	cases = append(cases, responseCases()...)
	cases = append(cases, smugglingCases()...)
	return cases
}

// h1RequestCases: bodies framed by Content-Length and in chunks, whole and
// broken, at each size.
func h1RequestCases() []integCase {
	var cases []integCase
	add := func(c integCase) {
		c.Kind, c.Proto, c.Responses = "request", "h1", 1
		cases = append(cases, c)
	}
	for _, n := range bodySizes {
		data := body(n)
		target := func(name string) string { return fmt.Sprintf("/i/%s-%d", name, n) }
		// Content-Length.
		t := target("cl")
		lengthHead := func(t string) string {
			return head("POST", t, fmt.Sprintf("Content-Length: %d", n))
		}
		add(integCase{Name: fmt.Sprintf("cl-%d", n), Writes: []string{lengthHead(t), data},
			Sent: map[string]sentRequest{t: {Method: "POST", Body: data}}})
		for _, at := range dedupe(0, 1, n/2, n-1) {
			if at >= n {
				continue
			}
			t := target(fmt.Sprintf("cl-close-at-%d", at))
			add(integCase{Name: fmt.Sprintf("cl-%d-close-at-%d", n, at), Writes: []string{lengthHead(t), data[:at]}, CloseWrite: true})
		}
		t = target("cl-early-close") + "-early"
		add(integCase{Name: fmt.Sprintf("cl-%d-early-close-at-%d", n, n/2), Writes: []string{lengthHead(t), data[:n/2]}, CloseWrite: true, Early: true})

		// Chunked, whole.
		te := "Transfer-Encoding: chunked"
		chunkedHead := func(t string, fields ...string) string {
			return head("POST", t, append([]string{te}, fields...)...)
		}
		whole := func(name, ext string, trailers [][2]string, fields ...string) {
			t := target(name)
			w := append([]string{chunkedHead(t, fields...)}, chunks(data, ext)...)
			last := "0\r\n"
			for _, tr := range trailers {
				last += tr[0] + ": " + tr[1] + "\r\n"
			}
			w = append(w, last+"\r\n")
			add(integCase{Name: fmt.Sprintf("%s-%d", name, n), Writes: w,
				Sent: map[string]sentRequest{t: {Method: "POST", Body: data, Trailers: trailers}}})
		}
		whole("chunked", "", nil)
		whole("chunked-trailers", "", [][2]string{{"X-Sum", crc(data)}}, "Trailer: X-Sum")
		whole("chunked-ext", ";name=value", nil)

		// Chunked, broken. parts are the request's chunks, whole.
		parts := chunks(data, "")
		broken := func(name string, w []string, closeWrite, early bool) {
			add(integCase{Name: fmt.Sprintf("%s-%d", name, n), Writes: w, CloseWrite: closeWrite, Early: early})
		}
		hd := func(name string) string { return chunkedHead(target(name)) }
		// The chunk after the first (or, for a body in one chunk, the last).
		laterSize := func(name, size string) []string {
			w := []string{hd(name), parts[0]}
			if len(parts) > 1 {
				return append(w, size+"\r\n"+parts[1][strings.Index(parts[1], "\r\n")+2:])
			}
			return append(w, size+"\r\n\r\n")
		}
		broken("chunked-bad-size-first", []string{hd("chunked-bad-size-first"), "zz\r\n" + data + "\r\n0\r\n\r\n"}, false, false)
		broken("chunked-bad-size-later", laterSize("chunked-bad-size-later", "zz"), false, false)
		broken("chunked-overflow-first", []string{hd("chunked-overflow-first"), "ffffffffffffffffffff\r\n" + data + "\r\n0\r\n\r\n"}, false, false)
		broken("chunked-overflow-later", laterSize("chunked-overflow-later", "ffffffffffffffffffff"), false, false)
		first := parts[0]
		broken("chunked-data-longer", []string{hd("chunked-data-longer"), strings.TrimSuffix(first, "\r\n") + "XX\r\n0\r\n\r\n"}, false, false)
		broken("chunked-missing-crlf", []string{hd("chunked-missing-crlf"), strings.TrimSuffix(first, "\r\n") + "0\r\n\r\n"}, false, false)
		broken("chunked-bad-trailer", append(append([]string{hd("chunked-bad-trailer")}, parts...), "0\r\nX-Bad trailer\r\n\r\n"), false, false)
		broken("chunked-close-in-size", []string{hd("chunked-close-in-size"), first[:1]}, true, false)
		broken("chunked-close-in-data", []string{hd("chunked-close-in-data"), first[:strings.Index(first, "\r\n")+2+len(first[strings.Index(first, "\r\n")+2:])/2]}, true, false)
		broken("chunked-close-before-last", append([]string{hd("chunked-close-before-last")}, parts...), true, false)
		broken("chunked-close-in-last", append(append([]string{hd("chunked-close-in-last")}, parts...), "0\r\n"), true, false)
		broken("chunked-close-in-trailers", append(append([]string{hd("chunked-close-in-trailers")}, parts...), "0\r\nX-Sum: "+crc(data)+"\r\n"), true, false)
		broken("chunked-early-bad-size-later", laterSize("chunked-early-bad-size-later-early", "zz"), false, true)
	}
	return cases
}

// dedupe keeps the first of each offset.
func dedupe(offsets ...int) []int {
	seen := map[int]bool{}
	var out []int
	for _, o := range offsets {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

// h2RequestCases: HTTP/2 request bodies, whole and broken, at each size.
func h2RequestCases() []integCase {
	var cases []integCase
	for _, n := range bodySizes {
		data := body(n)
		length := [][2]string{{"content-length", fmt.Sprint(n)}}
		add := func(name string, plan h2Plan, whole bool) {
			plan.Method = "POST"
			plan.Path = fmt.Sprintf("/i/h2-%s-%d", name, n)
			if strings.Contains(name, "early") {
				plan.Path += "-early"
			}
			plan.Data = data
			c := integCase{Name: fmt.Sprintf("h2-%s-%d", name, n), Kind: "request", Proto: "h2", H2: &plan, Early: strings.Contains(name, "early")}
			if whole {
				c.Sent = map[string]sentRequest{plan.Path: {Method: "POST", Body: data, Trailers: plan.Trailers}}
			}
			cases = append(cases, c)
		}
		add("cl", h2Plan{Fields: length, Cut: n, End: "end"}, true)
		add("no-cl", h2Plan{Cut: n, End: "end"}, true)
		add("trailers", h2Plan{Cut: n, End: "trailers", Trailers: [][2]string{{"x-sum", crc(data)}}}, true)
		for _, at := range dedupe(0, n/2, n) {
			add(fmt.Sprintf("rst-at-%d", at), h2Plan{Fields: length, Cut: at, End: "rst"}, false)
		}
		add(fmt.Sprintf("no-cl-rst-at-%d", n/2), h2Plan{Cut: n / 2, End: "rst"}, false)
		add(fmt.Sprintf("end-short-at-%d", n/2), h2Plan{Fields: length, Cut: n / 2, End: "end"}, false)
		add(fmt.Sprintf("close-at-%d", n/2), h2Plan{Fields: length, Cut: n / 2, End: "close"}, false)
		add(fmt.Sprintf("early-rst-at-%d", n/2), h2Plan{Fields: length, Cut: n / 2, End: "rst"}, false)
		// More data than content-length said.
		over := h2Plan{Fields: [][2]string{{"content-length", fmt.Sprint(n - 1)}}, Cut: n, End: "end"}
		add("over-cl", over, false)
	}
	return cases
}

// responseCases: an app whose answer breaks, to HTTP/1.1 clients (the app
// speaks HTTP/1.1) and to HTTP/2 clients (h2c), each on a GET.
func responseCases() []integCase {
	var cases []integCase
	for _, kind := range []string{"chunked-bad-size", "chunked-close", "chunked-data-longer", "cl-short", "cl-short-large", "head-close"} {
		cases = append(cases, integCase{Name: "response-" + kind, Kind: "response", Proto: "h1", Responses: 1,
			Writes: []string{head("GET", "/r/"+kind)}, Sent: map[string]sentRequest{"/r/" + kind: {Method: "GET"}}})
	}
	for _, kind := range []string{"h2-rst-mid", "h2-short-cl", "h2-close-mid", "h2-rst-nocl"} {
		cases = append(cases, integCase{Name: "response-" + kind, Kind: "response", Proto: "h2",
			H2: &h2Plan{Method: "GET", Path: "/r/" + kind, End: "end"}, Sent: map[string]sentRequest{"/r/" + kind: {Method: "GET"}}})
	}
	return cases
}

// smugglingCases: requests whose framing parsers can read differently,
// most followed by a second request that would be smuggled if the first's
// end were misread. What the app gets from qproxy must be what it gets
// from Go's queue-proxy, or less (a refusal).
func smugglingCases() []integCase {
	second := func(name string) string { return head("GET", "/s/"+name+"/2") }
	sent := func(name string, firsts ...string) map[string]sentRequest {
		m := map[string]sentRequest{"/s/" + name + "/2": {Method: "GET"}}
		for i := 0; i+1 < len(firsts); i += 2 {
			m["/s/"+name+"/1"] = sentRequest{Method: firsts[i], Body: firsts[i+1]}
		}
		return m
	}
	var cases []integCase
	add := func(name, first string, whole map[string]sentRequest, responses int) {
		cases = append(cases, integCase{Name: "smuggle-" + name, Kind: "smuggling", Proto: "h1",
			Writes: []string{first + second(name)}, Responses: responses, Sent: whole})
	}
	post := func(name string, fields ...string) string { return head("POST", "/s/"+name+"/1", fields...) }
	// A chunked body that reads as "hello", and as other bytes to a
	// reader that takes another framing.
	chunkedHello := "5\r\nhello\r\n0\r\n\r\n"
	for _, c := range []struct {
		name   string
		fields []string
	}{
		{"cl-and-te", []string{"Content-Length: 4", "Transfer-Encoding: chunked"}},
		{"te-and-cl", []string{"Transfer-Encoding: chunked", "Content-Length: 4"}},
		{"te-chunked-identity", []string{"Transfer-Encoding: chunked, identity"}},
		{"te-identity-chunked", []string{"Transfer-Encoding: identity, chunked"}},
		{"te-gzip-chunked", []string{"Transfer-Encoding: gzip, chunked"}},
		{"te-spaces", []string{"Transfer-Encoding:   chunked  "}},
		{"te-tab", []string{"Transfer-Encoding:\tchunked"}},
		{"te-upper", []string{"Transfer-Encoding: CHUNKED"}},
		{"te-twice", []string{"Transfer-Encoding: chunked", "Transfer-Encoding: chunked"}},
		{"te-twice-identity", []string{"Transfer-Encoding: identity", "Transfer-Encoding: chunked"}},
		{"te-xchunked", []string{"Transfer-Encoding: xchunked"}},
		{"te-obs-fold", []string{"Transfer-Encoding:", " chunked"}},
		{"te-space-before-colon", []string{"Transfer-Encoding : chunked"}},
		{"te-and-cl-obs-fold", []string{"Content-Length: 4", "Transfer-Encoding:", " chunked"}},
	} {
		add(c.name, post(c.name, c.fields...)+chunkedHello, sent(c.name, "POST", "hello"), 2)
	}
	for _, c := range []struct {
		name   string
		fields []string
	}{
		{"cl-twice-different", []string{"Content-Length: 5", "Content-Length: 6"}},
		{"cl-twice-same", []string{"Content-Length: 5", "Content-Length: 5"}},
		{"cl-list", []string{"Content-Length: 5, 5"}},
		{"cl-plus", []string{"Content-Length: +5"}},
		{"cl-space-before-colon", []string{"Content-Length : 5"}},
		{"cl-leading-zeros", []string{"Content-Length: 0005"}},
		{"cl-hex", []string{"Content-Length: 0x5"}},
	} {
		add(c.name, post(c.name, c.fields...)+"hello", sent(c.name, "POST", "hello"), 2)
	}
	// A body with a second request behind it, in one write.
	add("pipelined", post("pipelined", "Content-Length: 5")+"hello", sent("pipelined", "POST", "hello"), 2)
	// Line ends of a bare LF.
	bare := strings.ReplaceAll(post("bare-lf", "Content-Length: 5"), "\r\n", "\n") + "hello"
	add("bare-lf", bare, sent("bare-lf", "POST", "hello"), 2)
	// HTTP/1.0 with a transfer coding: Go ignores it (no body, and the
	// chunks read as a next request), hyper refuses the request (400).
	http10 := strings.Replace(post("http10-te", "Transfer-Encoding: chunked"), "HTTP/1.1", "HTTP/1.0", 1) + chunkedHello
	add("http10-te", http10, sent("http10-te", "POST", "hello"), 2)
	// A chunk size with spaces after it, and a chunk extension with a
	// bare LF.
	add("chunk-size-space", post("chunk-size-space", "Transfer-Encoding: chunked")+"5 \r\nhello\r\n0\r\n\r\n", sent("chunk-size-space", "POST", "hello"), 2)
	add("chunk-ext-lf", post("chunk-ext-lf", "Transfer-Encoding: chunked")+"5;a\nhello\r\n0\r\n\r\n", sent("chunk-ext-lf", "POST", "hello"), 2)
	add("chunk-data-lf", post("chunk-data-lf", "Transfer-Encoding: chunked")+"5\r\nhello\n0\r\n\r\n", sent("chunk-data-lf", "POST", "hello"), 2)
	return cases
}
