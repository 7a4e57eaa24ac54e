package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/encoding/protowire"
)

var ports = map[string]int{"": 8012, "main": 8012, "tls": 8112, "admin": 8022, "stats": 9090, "metrics": 9091}

// Headers a client or app sees that differ run to run whoever answers:
// recorded as present, not by value.
var volatile = map[string]bool{"Date": true, "Sec-Websocket-Key": true, "Sec-Websocket-Accept": true}

// timing classes a duration: "immediate" under 750 ms, else whole seconds
// (to the nearest five from 5 s on). The waits scenarios provoke (a
// timeout, an app's sleep) are whole seconds or lie well inside a class,
// so a proxy slowed by the runs beside it stays in its class.
func timing(d time.Duration) string {
	if d < 750*time.Millisecond {
		return "immediate"
	}
	if d >= 5*time.Second {
		return fmt.Sprintf("~%ds", int(math.Round(d.Seconds()/5))*5)
	}
	return fmt.Sprintf("~%ds", int(math.Round(d.Seconds())))
}

// exchange is the outcome of one request, as fields.
type exchange map[string]string

func (e exchange) into(prefix string, obs *Observation) {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		obs.Set(prefix+k, e[k])
	}
}

// errClass names an I/O error the way a client would tell it apart.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, http.ErrHandlerTimeout):
		return "timeout"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		return "stream-reset " + se.Code.String()
	}
	var ge http2.GoAwayError
	if errors.As(err, &ge) {
		return "goaway " + ge.ErrCode.String()
	}
	msg := err.Error()
	if strings.Contains(msg, "stream error") {
		return "stream-reset"
	}
	if strings.Contains(msg, "malformed") || strings.Contains(msg, "unexpected EOF") {
		return "closed"
	}
	return "error: " + msg
}

func headerFields(prefix string, h http.Header, e exchange) {
	for name, values := range h {
		if volatile[name] {
			e[prefix+name] = "(present)"
			continue
		}
		e[prefix+name] = strings.Join(values, " | ")
	}
}

var (
	repeatRef = regexp.MustCompile(`\{\{(.|"[^"]*")\*(\d+)\}\}`)
	hexRef    = regexp.MustCompile(`\\x([0-9a-fA-F]{2})`)
)

// expand turns a scenario's string into the bytes to send: {{c*N}} is N
// times c, {{"text"*N}} N times text, \xNN is the byte NN.
func expand(s string) string {
	s = repeatRef.ReplaceAllStringFunc(s, func(m string) string {
		parts := repeatRef.FindStringSubmatch(m)
		n, _ := strconv.Atoi(parts[2])
		unit := parts[1]
		if len(unit) > 1 {
			unit = unit[1 : len(unit)-1]
		}
		return strings.Repeat(unit, n)
	})
	return hexRef.ReplaceAllStringFunc(s, func(m string) string {
		b, _ := strconv.ParseUint(m[2:], 16, 8)
		return string([]byte{byte(b)})
	})
}

// line is the request's method and path, GET and / unless set.
func (r *Request) line() (method, path string) {
	method, path = r.Method, r.Path
	if method == "" {
		method = "GET"
	}
	if path == "" {
		path = "/"
	}
	return method, path
}

// rawRequest spells a request out as HTTP/1.1 bytes.
func rawRequest(r *Request) []byte {
	method, path := r.line()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", method, expand(path))
	hasHost := false
	for _, h := range r.Headers {
		if strings.EqualFold(h[0], "Host") {
			hasHost = true
		}
	}
	if !hasHost {
		b.WriteString("Host: example.com\r\n")
	}
	for _, h := range r.Headers {
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], expand(h[1]))
	}
	if r.Body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(r.Body))
	}
	b.WriteString("\r\n")
	b.WriteString(r.Body)
	return b.Bytes()
}

// do runs one request and returns its fields; in a warm play on a
// connection that served a request first (warm).
func do(r *Request, warm bool) exchange {
	deadline := time.Now().Add(5 * time.Second)
	for {
		e := exchange{}
		e = doOn(r, open(r, warm, e), e)
		if r.Until == 0 || e["status"] == strconv.Itoa(r.Until) || time.Now().After(deadline) {
			return e
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// doOn runs r on conn (nil when it failed to open, the failure in e).
func doOn(r *Request, conn *clientConn, e exchange) exchange {
	if conn == nil {
		return e
	}
	defer conn.Close()
	switch r.Proto {
	case "", "h1":
		return doH1(r, conn, e)
	case "h2", "h2c":
		return doH2(r, conn, e)
	case "raw":
		return doRaw(r, conn, e)
	}
	e["error"] = "unknown proto " + r.Proto
	return e
}

// errTLS is the error of a connection whose TLS handshake failed, which
// the tls.* fields already describe.
var errTLS = errors.New("TLS handshake failed")

// dial opens a connection to r's port, over TLS when r asks for it.
func dial(r *Request, e exchange) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", ports[r.Port]), 2*time.Second)
	if err != nil || r.TLS == nil {
		return conn, err
	}
	tc := handshake(conn, r.TLS, e)
	if tc == nil {
		conn.Close()
		return nil, errTLS
	}
	return tc, nil
}

// clientConn is the connection a request goes on, and for HTTP/2 the
// client connection over it.
type clientConn struct {
	net.Conn
	h2 *http2.ClientConn
}

// reachesApp says whether requests on r's port go to the app.
func reachesApp(r *Request) bool {
	return r.Port == "" || r.Port == "main" || r.Port == "tls"
}

// warmPath is the request a warm play sends first on each connection that
// reaches the app; the app answers it and does not record it.
const warmPath = "/__warm"

// open opens a connection for r, with a deadline for its I/O. In a warm
// play (warm), a request to the app goes on a connection that has served
// one already, so that the proxy's connection to the app is pooled too:
// an HTTP/1.1 GET of warmPath, or an HTTP/2 stream; its outcome is the
// field warmup. If the proxy closes the connection after it, the request
// goes on a new one (the proxy's pool still warm), and warmup says so. A
// connection that fails to open is nil, with the failure in e.
func open(r *Request, warm bool, e exchange) *clientConn {
	warm = warm && reachesApp(r)
	for try := 0; ; try++ {
		conn, err := dial(r, e)
		if err != nil {
			if err != errTLS {
				e["conn"] = errClass(err)
			}
			return nil
		}
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		c := &clientConn{Conn: conn}
		if r.Proto == "h2" || r.Proto == "h2c" {
			tr := &http2.Transport{AllowHTTP: true}
			if c.h2, err = tr.NewClientConn(conn); err != nil {
				e["conn"] = errClass(err)
				conn.Close()
				return nil
			}
		}
		if !warm || try > 0 {
			return c
		}
		if c.warmUp(r, e) {
			return c
		}
		c.Close()
	}
}

// warmUp sends warmPath on c and reads its answer; false when c cannot
// serve another request.
func (c *clientConn) warmUp(r *Request, e exchange) bool {
	if c.h2 != nil {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, ports[r.Port], warmPath), nil)
		req.Host = "example.com"
		res, err := c.h2.RoundTrip(req)
		if err != nil {
			e["warmup"] = errClass(err)
			return c.h2.CanTakeNewRequest()
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		e["warmup"] = strconv.Itoa(res.StatusCode)
		return c.h2.CanTakeNewRequest()
	}
	if _, err := c.Write([]byte("GET " + warmPath + " HTTP/1.1\r\nHost: example.com\r\n\r\n")); err != nil {
		e["warmup"] = errClass(err)
		return false
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		e["warmup"] = errClass(err)
		return false
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	e["warmup"] = strconv.Itoa(res.StatusCode)
	if err != nil || res.Close || br.Buffered() > 0 {
		e["warmup"] += " (connection closed after it)"
		return false
	}
	return true
}

// write writes request on c, noting a failure in e.
func (c *clientConn) write(request []byte, e exchange) {
	if _, err := c.Write(request); err != nil {
		e["write"] = errClass(err)
	}
}

func doH1(r *Request, conn *clientConn, e exchange) exchange {
	start := time.Now()
	conn.write(rawRequest(r), e)
	br := bufio.NewReader(conn)
	method, _ := r.line()
	res, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		e["response"] = errClass(err)
		e["timing"] = timing(time.Since(start))
		return e
	}
	if res.TransferEncoding != nil {
		e["transfer-encoding"] = strings.Join(res.TransferEncoding, ",")
	}
	if err := record(res, start, e); err != nil || r.NoReuse {
		return e
	}
	if res.Close {
		// The response said the connection ends: see that it does.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := br.ReadByte()
		e["connection"] = errClass(err)
		return e
	}
	// What became of the connection: a second request on it tells kept
	// alive from closed or reset without waiting on a clock.
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("GET /__ping HTTP/1.1\r\nHost: example.com\r\n\r\n")); err != nil {
		e["connection"] = errClass(err)
		return e
	}
	ping, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		e["connection"] = errClass(err)
		return e
	}
	io.Copy(io.Discard, ping.Body)
	ping.Body.Close()
	e["connection"] = "kept-alive"
	return e
}

var (
	dateLine   = regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`)
	statusLine = regexp.MustCompile(`(?m)^HTTP/\d\.\d (\d{3}) `)
)

func doRaw(r *Request, conn *clientConn, e exchange) exchange {
	start := time.Now()
	// Lines of a raw request end in CRLF, as HTTP wants.
	raw := expand(strings.ReplaceAll(r.Raw, "\n", "\r\n"))
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	conn.write([]byte(raw), e)
	got, err := io.ReadAll(conn)
	e["bytes"] = printable(sortHeads(dateLine.ReplaceAll(got, nil)))
	// The statuses alone too, so that an entry of expected.yaml that
	// explains a difference in the bytes (an error text) hides no
	// difference in status.
	var statuses []string
	for _, m := range statusLine.FindAllSubmatch(got, -1) {
		statuses = append(statuses, string(m[1]))
	}
	e["statuses"] = strings.Join(statuses, " ")
	e["end"] = errClass(err)
	e["timing"] = timing(time.Since(start))
	return e
}

// sortHeads puts the header lines of every response head in got in name
// order: HTTP gives the order of different fields no meaning (RFC 9110,
// 5.3), and Go and hyper write them in different orders.
func sortHeads(got []byte) []byte {
	var out []byte
	rest := got
	for len(rest) > 0 {
		if !bytes.HasPrefix(rest, []byte("HTTP/")) {
			return append(out, rest...)
		}
		end := bytes.Index(rest, []byte("\r\n\r\n"))
		if end < 0 {
			return append(out, rest...)
		}
		lines := strings.Split(string(rest[:end]), "\r\n")
		sort.SliceStable(lines[1:], func(i, j int) bool {
			return strings.ToLower(lines[1+i]) < strings.ToLower(lines[1+j])
		})
		out = append(out, strings.Join(lines, "\r\n")...)
		out = append(out, "\r\n\r\n"...)
		rest = rest[end+4:]
		// A body follows a final head; only a 1xx head is followed by
		// another head.
		if len(lines[0]) < 10 || lines[0][9] != '1' {
			return append(out, rest...)
		}
	}
	return out
}

func doH2(r *Request, conn *clientConn, e exchange) exchange {
	start := time.Now()
	method, path := r.line()
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, ports[r.Port], path), body)
	if err != nil {
		e["request"] = err.Error()
		return e
	}
	req.Host = "example.com"
	for _, h := range r.Headers {
		if strings.EqualFold(h[0], "Host") {
			req.Host = h[1]
			continue
		}
		req.Header.Add(h[0], h[1])
	}
	// Prior knowledge: HTTP/2 whatever ALPN chose, as the activator speaks
	// it to a pod over TLS.
	res, err := conn.h2.RoundTrip(req)
	if err != nil {
		e["response"] = errClass(err)
		e["timing"] = timing(time.Since(start))
		return e
	}
	record(res, start, e)
	return e
}

// record reads res to its end and puts what a client sees of it into e:
// status, protocol, header fields, body, trailers and the timing class from
// start. It returns the error that ended the body, if any.
func record(res *http.Response, start time.Time, e exchange) error {
	e["status"] = strconv.Itoa(res.StatusCode)
	e["proto"] = res.Proto
	headerFields("header.", res.Header, e)
	body, err := io.ReadAll(res.Body)
	e["body"] = printable(body)
	e["body.end"] = errClass(err)
	headerFields("trailer.", res.Trailer, e)
	e["timing"] = timing(time.Since(start))
	return err
}

// printable keeps a body readable in the report: long ones by length and a
// prefix.
func printable(b []byte) string {
	s := strconv.Quote(string(b))
	if len(s) > 200 {
		return fmt.Sprintf("%d bytes %s…", len(b), s[:120])
	}
	return s
}

// doWebSocket opens a WebSocket to path (in a warm play on a connection
// that served a request first), echoes two messages and closes it.
func doWebSocket(path string, warm bool) exchange {
	e := exchange{}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	d.NetDialContext = func(context.Context, string, string) (net.Conn, error) {
		c := open(&Request{}, warm, e)
		if c == nil {
			return nil, errors.New("no connection: " + e["conn"])
		}
		c.SetDeadline(time.Time{})
		return c.Conn, nil
	}
	conn, res, err := d.Dial(fmt.Sprintf("ws://127.0.0.1:8012%s", path), http.Header{"Host": {"example.com"}})
	if res != nil {
		e["status"] = strconv.Itoa(res.StatusCode)
		headerFields("header.", res.Header, e)
	}
	if err != nil {
		e["dial"] = errClass(err)
		return e
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	for _, msg := range []string{"one", "two"} {
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			e["write"] = errClass(err)
			return e
		}
		_, got, err := conn.ReadMessage()
		if err != nil {
			e["read"] = errClass(err)
			return e
		}
		e["echo."+msg] = string(got)
	}
	err = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"))
	e["close"] = errClass(err)
	_, _, err = conn.ReadMessage()
	if ce, ok := err.(*websocket.CloseError); ok {
		e["closed-with"] = strconv.Itoa(ce.Code)
	} else {
		e["closed-with"] = errClass(err)
	}
	return e
}

// statFields reads the autoscaler's Stat, waiting (up to 3 s) for a report
// that counted a request.
func statFields() exchange {
	e := exchange{}
	deadline := time.Now().Add(3 * time.Second)
	for {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:9090/metrics", nil)
		req.Header.Set("Accept", "application/protobuf")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			e["error"] = errClass(err)
			return e
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		e["status"] = strconv.Itoa(res.StatusCode)
		e["header.Content-Type"] = res.Header.Get("Content-Type")
		stat := decodeStat(data)
		if stat["request_count"] != "0" || time.Now().After(deadline) {
			for k, v := range stat {
				e[k] = v
			}
			return e
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// decodeStat reads Knative's Stat message. Figures that depend on where
// the one-second windows fell are recorded as zero or not.
func decodeStat(b []byte) map[string]string {
	out := map[string]string{"pod_name": "", "request_count": "0", "average_concurrent_requests": "0",
		"proxied_request_count": "0", "average_proxied_concurrent_requests": "0", "process_uptime": "0"}
	names := map[protowire.Number]string{2: "average_concurrent_requests", 3: "average_proxied_concurrent_requests",
		4: "request_count", 5: "proxied_request_count", 6: "process_uptime"}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			out["decode"] = "bad tag"
			return out
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			out["pod_name"] = string(v)
			b = b[n:]
		case typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if name, ok := names[num]; ok && math.Float64frombits(v) != 0 {
				out[name] = "non-zero"
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				out["decode"] = "bad field"
				return out
			}
			out[fmt.Sprintf("field%d", num)] = "present"
			b = b[n:]
		}
	}
	return out
}

// requestCounters are the samples, per generation, that count every
// request answered: Knative records them once the answer is out, classic
// through OpenCensus's worker, so a scrape right after may miss the last.
var requestCounters = map[string][]string{
	"classic": {"revision_request_count", "revision_app_request_count"},
	"current": {"http_server_request_duration_seconds_count", "kn_serving_invocation_duration_seconds_count"},
}

// metricsFields reads :9091/metrics once every request counter of gen has
// counted the answered requests (or 3 s have passed): every sample but
// latency buckets and sums (which depend on timing), with its value.
func metricsFields(gen string, answered int) exchange {
	e := exchange{}
	deadline := time.Now().Add(3 * time.Second)
	var data []byte
	var res *http.Response
	for {
		var err error
		res, err = http.Get("http://127.0.0.1:9091/metrics")
		if err != nil {
			e["error"] = errClass(err)
			return e
		}
		data, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if countedAll(string(data), requestCounters[gen], answered) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e["status"] = strconv.Itoa(res.StatusCode)
	for _, sm := range samples(string(data)) {
		metric, name, value := sm.metric, sm.name, sm.value
		if strings.HasSuffix(metric, "_bucket") || strings.HasSuffix(metric, "_sum") {
			continue
		}
		// qproxy's own additions (the autoscaler's view) have no
		// counterpart to compare with.
		if strings.HasPrefix(metric, "qproxy_") {
			continue
		}
		e["sample."+name] = value
	}
	return e
}

// countedAll says whether each of counters sums to at least n over its
// samples in a Prometheus text exposition.
func countedAll(text string, counters []string, n int) bool {
	sums := map[string]float64{}
	for _, sm := range samples(text) {
		if v, err := strconv.ParseFloat(sm.value, 64); err == nil {
			sums[sm.metric] += v
		}
	}
	for _, c := range counters {
		if sums[c] < float64(n) {
			return false
		}
	}
	return true
}

// sample is one line of a Prometheus text exposition: the metric's name,
// the sample's name with its labels, and its value.
type sample struct{ metric, name, value string }

// samples reads the sample lines of a Prometheus text exposition.
func samples(text string) []sample {
	var out []sample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, _ := strings.Cut(line, " ")
		metric := name
		if i := strings.IndexByte(name, '{'); i >= 0 {
			metric = name[:i]
		}
		out = append(out, sample{metric, name, value})
	}
	return out
}
