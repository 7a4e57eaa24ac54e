package main

// The cases of the failure-mode suite (failures.go) and their clients.

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"
)

// failCases is every case, in the report's order.
func failCases() []failCase {
	var cases []failCase
	for _, idle := range []int{1, 5} {
		for _, rst := range []bool{false, true} {
			for _, announce := range []bool{true, false} {
				cases = append(cases, keepAliveCase(onTimer, idle, rst, announce))
			}
		}
	}
	for _, rst := range []bool{false, true} {
		for _, announce := range []bool{true, false} {
			cases = append(cases, keepAliveCase(onLateArrival, 1, rst, announce))
		}
	}
	cases = append(cases, keepAliveCase(onLateArrival, 5, false, true))
	for _, rst := range []bool{false, true} {
		cases = append(cases, readsAndClosesCase(rst))
	}
	cases = append(cases, wedgeCase(), appRestartCase(), hangUpCase(), drainCase(true), drainCase(false))
	return cases
}

// A request kind the clients send, and whether Go's transport may send it
// twice (no body, and idempotent or with an idempotency key).
type reqKind struct {
	name       string
	replayable bool
}

var (
	kindGet        = reqKind{"GET", true}
	kindPost       = reqKind{"POST", false}
	kindPostSplit  = reqKind{"POST-split", false}
	kindChunked    = reqKind{"POST-chunked", false}
	kindIdempotent = reqKind{"POST-idempotency-key", true}
	kindPostEmpty  = reqKind{"POST-empty", false}
)

// keepAliveKinds are the kinds the keep-alive clients send in turn.
var keepAliveKinds = []reqKind{kindGet, kindPost, kindPostSplit, kindChunked, kindIdempotent}

// keepAliveCase is an app that closes idle kept-alive connections after
// idle seconds, four clients each on a kept-alive connection to the proxy
// sending the kinds in turn, 0.5 to 1.5 idle times apart.
func keepAliveCase(model closeModel, idle int, rst, announce bool) failCase {
	how := "fin"
	if rst {
		how = "rst"
	}
	said := "silent"
	if announce {
		said = "announced"
	}
	name := fmt.Sprintf("keepalive-%ds-%s-%s", idle, how, said)
	what := fmt.Sprintf("an app that closes kept-alive connections idle for %d s (with a %s)", idle, strings.ToUpper(how))
	if model == onLateArrival {
		name = fmt.Sprintf("keepalive-race-%ds-%s-%s", idle, how, said)
		what = fmt.Sprintf("an app that closes a kept-alive connection, its request unread (with a %s), when the request comes more than %d s after its last answer: its timer and the request crossing, every time", strings.ToUpper(how), idle)
	}
	if announce {
		what += fmt.Sprintf(", announcing `Keep-Alive: timeout=%d`", idle)
	}
	clients, perClient := 4, 30
	if model == onLateArrival {
		// One client: every gap past the idle time is a stale reuse.
		clients, perClient = 1, 40
	}
	if idle >= 5 {
		perClient = 10
	}
	what += fmt.Sprintf("; %d client(s) × %d requests (GET, POST, POST in two writes, chunked POST, bodyless POST with `Idempotency-Key`, in turn), %.1f–%.1f s apart",
		clients, perClient, float64(idle)/2, float64(idle)*1.5)
	c := failCase{
		Name: name, Issues: "#12414, #14730", What: what,
		Generations: []string{"current"},
	}
	if announce {
		c.QproxyZero = []string{"failed"}
	}
	idleTime := time.Duration(idle) * time.Second
	c.Play = func(p *failPlay) {
		app, err := startIdleCloser(idleTime, rst, announce, model)
		if err != nil || p.Start(app.port()) != nil {
			p.set("setup-failed", 1)
			return
		}
		var mu sync.Mutex
		kinds := map[string]reqKind{}
		var failedIDs []string
		var wg sync.WaitGroup
		for ci := 0; ci < clients; ci++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewSource(int64(ci + 1)))
				client := &rawClient{}
				defer client.close()
				time.Sleep(time.Duration(ci) * idleTime / 4)
				for i := 0; i < perClient; i++ {
					kind := keepAliveKinds[(i+ci)%len(keepAliveKinds)]
					id := fmt.Sprintf("c%d-%d", ci, i)
					status, _ := client.do(kind, id, "/keepalive")
					mu.Lock()
					kinds[id] = kind
					if status != 200 {
						failedIDs = append(failedIDs, id)
					}
					mu.Unlock()
					p.add("sent", 1)
					// The spacing is the case: requests around the idle time.
					gap := 0.5 + rnd.Float64()
					time.Sleep(time.Duration(gap * float64(idleTime)))
				}
				p.add("client.reconnects", client.reconnects)
			}()
		}
		wg.Wait()
		read, unread, conns, closes := app.snapshot()
		countFailures(p, failedIDs, kinds, read, unread)
		p.set("app.connections", conns)
		p.set("app.closes", closes)
	}
	return c
}

// countFailures classifies the failed requests by what the app saw of
// them, and counts requests the app read twice.
func countFailures(p *failPlay, failedIDs []string, kinds map[string]reqKind, read map[string]int, unread map[string]bool) {
	p.set("failed", len(failedIDs))
	for _, id := range failedIDs {
		p.add("by-kind."+kinds[id].name, 1)
		switch {
		case read[id] > 0:
			p.add("failed.read-by-app", 1)
		case unread[id]:
			p.add("failed.unread-at-close", 1)
		default:
			p.add("failed.never-arrived", 1)
		}
	}
	for id, n := range read {
		if n < 2 {
			continue
		}
		if kinds[id].replayable {
			p.add("app.read-twice", 1)
		} else {
			p.add("failed.read-twice", 1)
		}
	}
}

// readsAndClosesCase: the app answers the first request on each
// connection and reads the second whole, then closes without answering.
// One client sends each kind in turn, back to back, so that every second
// request lands on a kept connection the app then closes.
func readsAndClosesCase(rst bool) failCase {
	how := "fin"
	if rst {
		how = "rst"
	}
	kindsInTurn := []reqKind{kindGet, kindPost, kindPostSplit, kindChunked, kindIdempotent, kindPostEmpty}
	return failCase{
		Name:   "reads-and-closes-" + how,
		Issues: "#12414",
		What: fmt.Sprintf("an app that answers a connection's first request and closes it (with a %s) after reading its second; "+
			"one client, 4 rounds of GET, POST, POST in two writes, chunked POST, bodyless POST with `Idempotency-Key`, bodyless POST, each after a GET so that it lands on a connection's second turn; "+
			"a request may be sent twice only by Go's rules", strings.ToUpper(how)),
		Generations: []string{"current"},
		Play: func(p *failPlay) {
			app, err := startIdleCloser(time.Hour, rst, false, readsSecondAndCloses)
			if err != nil || p.Start(app.port()) != nil {
				p.set("setup-failed", 1)
				return
			}
			client := &rawClient{}
			defer client.close()
			kinds := map[string]reqKind{}
			var failedIDs []string
			n := 0
			send := func(kind reqKind) {
				id := fmt.Sprintf("r%d", n)
				n++
				kinds[id] = kind
				if status, _ := client.do(kind, id, "/reads-and-closes"); status != 200 {
					failedIDs = append(failedIDs, id)
				}
				p.add("sent", 1)
			}
			for round := 0; round < 4; round++ {
				for _, kind := range kindsInTurn {
					// A GET first, so that the request lands on a kept
					// connection's second turn.
					send(kindGet)
					send(kind)
				}
			}
			p.set("client.reconnects", client.reconnects)
			read, unread, conns, _ := app.snapshot()
			countFailures(p, failedIDs, kinds, read, unread)
			p.set("app.connections", conns)
		},
	}
}

// wedgeCase: the app wedges a kept connection (reads a request, never
// answers); the revision's timeout is 4 s.
func wedgeCase() failCase {
	return failCase{
		Name:   "wedged-connection",
		Issues: "#16043",
		What: "the app reads the second request on its first connection and never answers; 20 requests from 4 clients while it hangs, " +
			"5 after; `timeoutSeconds: 4`. None may wait behind the wedged one, which ends at the timeout (`504`)",
		Generations: []string{"current"},
		Env:         map[string]string{"REVISION_TIMEOUT_SECONDS": "4"},
		QproxyZero:  []string{"failed"},
		Play: func(p *failPlay) {
			app, err := startWedgeApp()
			if err != nil || p.Start(app.port()) != nil {
				p.set("setup-failed", 1)
				return
			}
			first := &rawClient{}
			defer first.close()
			failed := 0
			get := func(c *rawClient, id string) int {
				status, _ := c.do(kindGet, id, "/wedge")
				p.add("sent", 1)
				if status != 200 {
					failed++
				}
				return status
			}
			get(first, "w-first")
			var stuckDone atomic.Bool
			stuck := make(chan int, 1)
			go func() {
				c := &rawClient{}
				defer c.close()
				status, _ := c.do(kindGet, "w-stuck", "/wedge")
				stuckDone.Store(true)
				stuck <- status
			}()
			select {
			case <-app.wedged:
			case <-time.After(10 * time.Second):
				p.set("setup-failed", 1)
				return
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for ci := 0; ci < 4; ci++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := &rawClient{}
					defer c.close()
					for i := 0; i < 5; i++ {
						status, _ := c.do(kindGet, fmt.Sprintf("w%d-%d", ci, i), "/wedge")
						mu.Lock()
						p.add("sent", 1)
						if status != 200 {
							failed++
						}
						if stuckDone.Load() {
							p.add("failed.waited-behind-wedged", 1)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			status := <-stuck
			p.set(fmt.Sprintf("wedged.answered-%d", status), 1)
			after := &rawClient{}
			defer after.close()
			for i := 0; i < 5; i++ {
				get(after, fmt.Sprintf("w-after-%d", i))
			}
			p.set("failed", failed)
		},
	}
}

// appRestartCase: the app crashes under load and comes back on its port
// half a second later, as one the kubelet restarts. A request that arrives
// meanwhile has not reached the app; one that was on the app's socket when
// it crashed may be sent again only by Go's rules.
func appRestartCase() failCase {
	return failCase{
		Name:   "app-restarts",
		Issues: "-",
		What: "4 clients, GET and a 64-byte POST in turn, 10 ms apart; the app resets every connection, listens again 500 ms later. " +
			"A GET may not fail with qproxy: one on the app's socket at the crash is sent again (by Go's rules too), one after it waits",
		Generations: []string{"current"},
		QproxyZero:  []string{"failed.get"},
		Play: func(p *failPlay) {
			app, err := startCrashApp()
			if err != nil || p.Start(app.port()) != nil {
				p.set("setup-failed", 1)
				return
			}
			var answered atomic.Int64
			var stop atomic.Bool
			var wg sync.WaitGroup
			for ci := 0; ci < 4; ci++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := &rawClient{}
					defer c.close()
					for i := 0; !stop.Load(); i++ {
						kind, name := kindGet, "get"
						if i%2 == 1 {
							kind, name = kindPost, "post"
						}
						status, _ := c.do(kind, fmt.Sprintf("r%d-%d", ci, i), "/")
						p.add("sent", 1)
						if status != 200 {
							p.add("failed", 1)
							p.add("failed."+name, 1)
						}
						answered.Add(1)
						time.Sleep(10 * time.Millisecond)
					}
				}()
			}
			waitCount := func(n int64) bool {
				deadline := time.Now().Add(10 * time.Second)
				for answered.Load() < n {
					if time.Now().After(deadline) {
						return false
					}
					time.Sleep(5 * time.Millisecond)
				}
				return true
			}
			if !waitCount(40) || app.crash(500*time.Millisecond) != nil || !waitCount(answered.Load()+40) {
				p.set("setup-failed", 1)
			}
			stop.Store(true)
			wg.Wait()
		},
	}
}

// hangUpCase: clients that go away mid-request: five GETs the app would
// answer after 3 s, closed after 300 ms; five POSTs that promise 1,000
// bytes, send 500 and close. The app must be told (its request's context
// cancelled, or its body cut) so that it stops working for nobody.
func hangUpCase() failCase {
	return failCase{
		Name:        "client-hangs-up",
		Issues:      "#15352, #14818",
		What:        "5 GETs the app answers after 3 s, their clients gone after 300 ms; 5 POSTs promising 1,000 bytes, sending 500 and closing. Counts the requests the app saw and was not told of, and the proxy's error log lines",
		Generations: []string{"classic", "current"},
		QproxyZero:  []string{"failed"},
		Play: func(p *failPlay) {
			app, err := startHangUpApp()
			if err != nil || p.Start(app.Port) != nil {
				p.set("setup-failed", 1)
				return
			}
			var wg sync.WaitGroup
			for i := 0; i < 10; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.add("sent", 1)
					conn, err := net.Dial("tcp", "127.0.0.1:8012")
					if err != nil {
						return
					}
					defer conn.Close()
					id := fmt.Sprintf("h%d", i)
					if i < 5 {
						fmt.Fprintf(conn, "GET /sleep?ms=3000 HTTP/1.1\r\nHost: app.example\r\n%s: %s\r\n\r\n", caseIDHeader, id)
					} else {
						fmt.Fprintf(conn, "POST /sleep?ms=0 HTTP/1.1\r\nHost: app.example\r\n%s: %s\r\nContent-Length: 1000\r\n\r\n%s",
							caseIDHeader, id, strings.Repeat("x", 500))
					}
					// The client gives up.
					time.Sleep(300 * time.Millisecond)
				}()
			}
			wg.Wait()
			// Every request the app has ends within 3 s, or sooner when
			// it is told.
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && app.pending() > 0 {
				time.Sleep(20 * time.Millisecond)
			}
			saw, untold := app.counts()
			p.set("app.saw", saw)
			p.set("failed", untold)
			p.set("proxy.error-log-lines", p.ErrorLines())
		},
	}
}

// drainCase: the kubelet's shutdown sequence with long exchanges in
// flight: SIGTERM to the proxy, the preStop `GET :8022/wait-for-drain`,
// SIGTERM to the app when it returns. In flight: a WebSocket chatting for
// 55 s, an event stream and a gRPC-shaped server stream of 40 s, and a
// request the app answers after 50 s of silence.
func drainCase(heeds bool) failCase {
	name, what := "drain-app-ignores-sigterm", "an app that ignores SIGTERM"
	if heeds {
		name, what = "drain-app-heeds-sigterm", "an app that sends its WebSockets a close (1000) on SIGTERM, then forgets their sockets, and finishes what it has"
	}
	return failCase{
		Name:   name,
		Issues: "#15759, #16080, #16625, #16362, #15649",
		What: what + "; SIGTERM to the proxy 2 s into a 55 s WebSocket, a 40 s event stream, a 40 s gRPC server stream over h2c " +
			"and a 50 s silent request, the preStop `/wait-for-drain`, then SIGTERM to the app. An exchange fails if it is cut",
		Generations: []string{"classic", "current"},
		Play: func(p *failPlay) {
			app, err := startLongApp(heeds)
			if err != nil || p.Start(app.Port) != nil {
				p.set("setup-failed", 1)
				return
			}
			exchanges := map[string]func() bool{
				"websocket": func() bool { return webSocketLasts(55) },
				"sse":       eventStreamLasts,
				"grpc":      grpcStreamLasts,
				"slow":      slowRequestLasts,
			}
			var wg sync.WaitGroup
			for name, run := range exchanges {
				wg.Add(1)
				p.add("sent", 1)
				go func() {
					defer wg.Done()
					if !run() {
						p.add("failed", 1)
						p.add("failed."+name, 1)
					}
				}()
			}
			// All four under way.
			time.Sleep(2 * time.Second)
			signalled := time.Now()
			p.Signal(syscall.SIGTERM)
			go func() {
				c := http.Client{Timeout: 3 * time.Minute}
				if res, err := c.Get("http://127.0.0.1:8022/wait-for-drain"); err == nil {
					res.Body.Close()
				}
				app.terminate()
			}()
			wg.Wait()
			if p.WaitExit(2 * time.Minute) {
				p.set("proxy.exited-after-s", int(time.Since(signalled).Seconds()))
			} else {
				p.set("proxy.still-running", 1)
			}
		},
	}
}

// webSocketLasts chats on a WebSocket for `seconds`, a message a second,
// and says whether it lasted: every echo back, closed with 1000 by either
// side.
func webSocketLasts(seconds int) bool {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, _, err := d.Dial("ws://127.0.0.1:8012/ws", http.Header{"Host": {"app.example"}})
	if err != nil {
		return false
	}
	defer conn.Close()
	start := time.Now()
	for i := 0; i < seconds; i++ {
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := conn.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, "%d", i)); err != nil {
			return false
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := conn.ReadMessage(); err != nil {
			// The app may end it, with a normal close.
			return websocket.IsCloseError(err, websocket.CloseNormalClosure)
		}
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * time.Second)))
	}
	conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "done"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = conn.ReadMessage()
	return websocket.IsCloseError(err, websocket.CloseNormalClosure)
}

// eventStreamLasts reads the app's 40 events and the stream's end.
func eventStreamLasts() bool {
	c := http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	req, _ := http.NewRequest("GET", "http://127.0.0.1:8012/sse", nil)
	req.Host = "app.example"
	res, err := c.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	events := 0
	scanner := bufio.NewScanner(res.Body)
	for scanner.Scan() {
		if strings.HasPrefix(scanner.Text(), "data:") {
			events++
		}
	}
	return scanner.Err() == nil && events == streamEvents
}

// grpcStreamLasts reads the app's 40 messages over h2c and its
// `Grpc-Status: 0` trailer.
func grpcStreamLasts() bool {
	t := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	c := http.Client{Timeout: 2 * time.Minute, Transport: t}
	req, _ := http.NewRequest("POST", "http://127.0.0.1:8012/grpc", nil)
	req.Host = "app.example"
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	res, err := c.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return err == nil && len(body) == streamEvents*9 && res.Trailer.Get("Grpc-Status") == "0"
}

// slowRequestLasts waits for the app's answer after 50 s of silence.
func slowRequestLasts() bool {
	c := http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	req, _ := http.NewRequest("GET", "http://127.0.0.1:8012/slow", nil)
	req.Host = "app.example"
	res, err := c.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return err == nil && res.StatusCode == 200 && string(body) == "done"
}

// rawClient is a client on one kept-alive connection to the proxy's main
// port, writing its requests byte by byte. Like Go's HTTP client, it
// notices that the proxy has closed its idle connection before it writes,
// and dials another; a request that fails once written is a failure.
type rawClient struct {
	conn       net.Conn
	br         *bufio.Reader
	reconnects int
}

func (c *rawClient) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// ready makes sure there is an open connection.
func (c *rawClient) ready() error {
	if c.conn != nil {
		c.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err := c.br.Peek(1)
		c.conn.SetReadDeadline(time.Time{})
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil
		}
		c.close()
		c.reconnects++
	}
	conn, err := net.Dial("tcp", "127.0.0.1:8012")
	if err != nil {
		return err
	}
	c.conn, c.br = conn, bufio.NewReader(conn)
	return nil
}

// do sends a request of `kind` for `path` with the id `id` and returns
// the status it got (0 when the exchange failed) and the body.
func (c *rawClient) do(kind reqKind, id, path string) (int, string) {
	if err := c.ready(); err != nil {
		return 0, err.Error()
	}
	head := func(method, extra string) string {
		return fmt.Sprintf("%s %s?id=%s HTTP/1.1\r\nHost: app.example\r\n%s: %s\r\n%s\r\n", method, path, id, caseIDHeader, id, extra)
	}
	body := strings.Repeat("b", 64)
	var parts []string
	switch kind {
	case kindGet:
		parts = []string{head("GET", "")}
	case kindPost:
		parts = []string{head("POST", "Content-Length: 64\r\n") + body}
	case kindPostSplit:
		parts = []string{head("POST", "Content-Length: 64\r\n"), body}
	case kindChunked:
		parts = []string{head("POST", "Transfer-Encoding: chunked\r\n") + "20\r\n" + body[:32] + "\r\n", "20\r\n" + body[32:] + "\r\n0\r\n\r\n"}
	case kindIdempotent:
		parts = []string{head("POST", "Idempotency-Key: "+id+"\r\nContent-Length: 0\r\n")}
	case kindPostEmpty:
		parts = []string{head("POST", "Content-Length: 0\r\n")}
	}
	c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	for i, part := range parts {
		if i > 0 {
			// The rest of the body comes a moment later, in a segment of
			// its own, as from a client that writes it apart.
			time.Sleep(2 * time.Millisecond)
		}
		if _, err := io.WriteString(c.conn, part); err != nil {
			c.close()
			return 0, err.Error()
		}
	}
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.close()
		return 0, err.Error()
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	c.conn.SetDeadline(time.Time{})
	if err != nil || res.Close {
		c.close()
	}
	if err != nil {
		return 0, err.Error()
	}
	return res.StatusCode, string(got)
}
