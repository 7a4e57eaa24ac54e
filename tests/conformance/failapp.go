package main

// The misbehaving apps of the failure-mode suite (failures.go): apps that
// close kept-alive connections on their own timer, or when a request comes
// late, or after reading a request; an app that wedges one connection; an
// app with long-lived exchanges that does or does not heed SIGTERM.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// caseIDHeader carries each request's id, for the app to count.
const caseIDHeader = "X-Case-Id"

var caseIDPattern = regexp.MustCompile(`(?i)\r\nx-case-id: *([^\r\n]+)`)

// closeModel is when an idle closer closes a kept-alive connection.
type closeModel int

const (
	// onTimer: once it has idled for the app's idle time, as Node.js,
	// gunicorn and Go's net/http close them.
	onTimer closeModel = iota
	// onLateArrival: when a request comes after the idle time, without
	// reading it: the app's timer and the request crossing, every time
	// (the race of knative/serving#12414 at its worst).
	onLateArrival
	// readsSecondAndCloses: answers a connection's first request, reads
	// its second whole and closes without answering.
	readsSecondAndCloses
)

// idleCloser is an app on raw TCP, speaking HTTP/1.1, that closes
// kept-alive connections as its model says, with a FIN or a reset, and
// says its idle time in `Keep-Alive: timeout=N` if it announces.
type idleCloser struct {
	idle     time.Duration
	rst      bool
	announce bool
	model    closeModel
	ln       net.Listener

	mu sync.Mutex
	// read counts the times the app read each request.
	read map[string]int
	// unread are the requests the app closed on with their bytes unread.
	unread map[string]bool
	conns  int
	closes int
}

// listenTCP listens on a free loopback port and serves each connection
// with serve, in a goroutine of its own.
func listenTCP(serve func(*net.TCPConn)) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c.(*net.TCPConn))
		}
	}()
	return ln, nil
}

// startIdleCloser listens on a free loopback port and serves.
func startIdleCloser(idle time.Duration, rst, announce bool, model closeModel) (*idleCloser, error) {
	a := &idleCloser{idle: idle, rst: rst, announce: announce, model: model,
		read: map[string]int{}, unread: map[string]bool{}}
	ln, err := listenTCP(func(c *net.TCPConn) {
		a.mu.Lock()
		a.conns++
		a.mu.Unlock()
		a.serve(c)
	})
	a.ln = ln
	return a, err
}

func (a *idleCloser) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

// serve answers requests on c until its model closes it.
func (a *idleCloser) serve(c *net.TCPConn) {
	defer c.Close()
	br := bufio.NewReader(c)
	served := 0
	var last time.Time
	for {
		if served > 0 && a.model == onTimer {
			c.SetReadDeadline(last.Add(a.idle))
		}
		if _, err := br.Peek(1); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				// The idle time is up: close, as the app's timer does.
				a.noteUnread(c, br)
				a.close(c)
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		if served > 0 && a.model == onLateArrival && time.Since(last) > a.idle {
			a.noteUnread(c, br)
			a.close(c)
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		a.mu.Lock()
		a.read[req.Header.Get(caseIDHeader)]++
		a.mu.Unlock()
		if served > 0 && a.model == readsSecondAndCloses {
			a.close(c)
			return
		}
		head := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
		if a.announce {
			head += fmt.Sprintf("Keep-Alive: timeout=%d\r\n", int(a.idle.Seconds()))
		}
		if _, err := io.WriteString(c, head+"\r\nok"); err != nil {
			return
		}
		served++
		last = time.Now()
	}
}

// noteUnread notes the request whose bytes wait unread on c, if any: read
// by the test, never by the app.
func (a *idleCloser) noteUnread(c *net.TCPConn, br *bufio.Reader) {
	pending, _ := br.Peek(br.Buffered())
	pending = append([]byte(nil), pending...)
	if raw, err := c.SyscallConn(); err == nil {
		buf := make([]byte, 8192)
		raw.Read(func(fd uintptr) bool {
			n, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err == nil && n > 0 {
				pending = append(pending, buf[:n]...)
			}
			return true
		})
	}
	if m := caseIDPattern.FindSubmatch(pending); m != nil {
		a.mu.Lock()
		a.unread[string(bytes.TrimSpace(m[1]))] = true
		a.mu.Unlock()
	}
}

// close closes c: a FIN (what came after it discarded, so that it stays
// a FIN), or a reset.
func (a *idleCloser) close(c *net.TCPConn) {
	a.mu.Lock()
	a.closes++
	a.mu.Unlock()
	if a.rst {
		c.SetLinger(0)
		c.Close()
		return
	}
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, c)
	c.Close()
}

// snapshot is what the app saw, by request id.
func (a *idleCloser) snapshot() (read map[string]int, unread map[string]bool, conns, closes int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	read = map[string]int{}
	for k, v := range a.read {
		read[k] = v
	}
	unread = map[string]bool{}
	for k, v := range a.unread {
		unread[k] = v
	}
	return read, unread, a.conns, a.closes
}

// wedgeApp answers every request but the second on the first connection
// it accepts, which it reads and never answers: the connection stays open,
// silent, until the proxy gives up on it.
type wedgeApp struct {
	ln     net.Listener
	wedged chan struct{}
	mu     sync.Mutex
	first  bool
}

func startWedgeApp() (*wedgeApp, error) {
	a := &wedgeApp{wedged: make(chan struct{})}
	ln, err := listenTCP(func(c *net.TCPConn) {
		a.mu.Lock()
		first := !a.first
		a.first = true
		a.mu.Unlock()
		a.serve(c, first)
	})
	a.ln = ln
	return a, err
}

func (a *wedgeApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *wedgeApp) serve(c net.Conn, first bool) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if first && n == 1 {
			close(a.wedged)
			// Silent until the proxy closes it.
			io.Copy(io.Discard, c)
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// longApp is an app with long-lived exchanges: a WebSocket echo, an
// event stream, a gRPC-shaped server stream over h2c, and a request it
// answers after a long silence. Its terminate plays the kubelet's SIGTERM:
// an app that heeds it closes its WebSockets with 1000 and stops taking
// connections, finishing what it has; one that ignores it goes on.
type longApp struct {
	*App
	heeds bool
	mu    sync.Mutex
	ws    []*wsConn
}

// wsConn is a WebSocket the app holds.
type wsConn struct {
	conn interface {
		WriteMessage(int, []byte) error
		WriteControl(int, []byte, time.Time) error
		ReadMessage() (int, []byte, error)
		Close() error
	}
}

// Lengths of the long exchanges.
const (
	streamEvents = 40
	slowAnswer   = 50 * time.Second
)

func startLongApp(heeds bool) (*longApp, error) {
	a := &longApp{heeds: heeds}
	app, err := StartApp(AppConfig{})
	if err != nil {
		return nil, err
	}
	a.App = app
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", a.websocket)
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < streamEvents; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(time.Second):
			case <-r.Context().Done():
				return
			}
		}
	})
	mux.HandleFunc("/grpc", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		for i := 0; i < streamEvents; i++ {
			// A gRPC message: uncompressed, 4 bytes of length, the bytes.
			w.Write([]byte{0, 0, 0, 0, 4})
			fmt.Fprintf(w, "%04d", i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(time.Second):
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Grpc-Status", "0")
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(slowAnswer):
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	})
	a.App.SetHandler(mux)
	return a, nil
}

func (a *longApp) websocket(w http.ResponseWriter, r *http.Request) {
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	ws := &wsConn{conn: conn}
	a.mu.Lock()
	a.ws = append(a.ws, ws)
	a.mu.Unlock()
	for {
		kind, msg, err := conn.ReadMessage()
		if err != nil {
			conn.Close()
			return
		}
		if err := conn.WriteMessage(kind, msg); err != nil {
			// Its close sent, this app forgets its socket: never closed.
			return
		}
	}
}

// terminate is the kubelet's SIGTERM to the app.
func (a *longApp) terminate() {
	if !a.heeds {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ws := range a.ws {
		ws.conn.WriteControl(8, closeFrame(1000, "shutting down"), time.Now().Add(time.Second))
	}
	go a.App.server.Shutdown(context.Background())
}

// closeFrame is a WebSocket close payload: the code, then the reason.
func closeFrame(code int, reason string) []byte {
	return append([]byte{byte(code >> 8), byte(code)}, reason...)
}

// hangUpApp records, for each request, whether the app was told the
// request was abandoned (its context cancelled, or its body cut) before it
// would have answered.
type hangUpApp struct {
	*App
	mu      sync.Mutex
	started map[string]bool
	told    map[string]bool
}

func startHangUpApp() (*hangUpApp, error) {
	app, err := StartApp(AppConfig{})
	if err != nil {
		return nil, err
	}
	a := &hangUpApp{App: app, started: map[string]bool{}, told: map[string]bool{}}
	app.SetHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(caseIDHeader)
		a.mu.Lock()
		a.started[id] = true
		a.mu.Unlock()
		told := false
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			told = true
		}
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
			told = true
		}
		a.mu.Lock()
		a.told[id] = told
		a.mu.Unlock()
		io.WriteString(w, "late")
	}))
	return a, nil
}

// pending counts the requests the app is still working on.
func (a *hangUpApp) pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.started) - len(a.told)
}

// counts says how many requests the app saw, and of how many it was not
// told that their client had gone.
func (a *hangUpApp) counts() (saw, untold int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, told := range a.told {
		if !told {
			untold++
		}
	}
	return len(a.started), untold
}

// crashApp is an app that crashes and comes back on the same port, as one
// the kubelet restarts: every connection reset, nothing listening for a
// while, then listening again. It answers each request at once.
type crashApp struct {
	mu    sync.Mutex
	ln    net.Listener
	conns map[*net.TCPConn]bool
}

func startCrashApp() (*crashApp, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &crashApp{ln: ln, conns: map[*net.TCPConn]bool{}}
	go a.accept(ln)
	return a, nil
}

func (a *crashApp) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *crashApp) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tc := c.(*net.TCPConn)
		a.mu.Lock()
		if a.ln != ln {
			// Accepted as the app crashed: gone with it.
			a.mu.Unlock()
			tc.SetLinger(0)
			tc.Close()
			continue
		}
		a.conns[tc] = true
		a.mu.Unlock()
		go a.serve(tc)
	}
}

func (a *crashApp) serve(c *net.TCPConn) {
	defer func() {
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// crash resets every connection and stops listening; after down, the app
// listens on its port again.
func (a *crashApp) crash(down time.Duration) error {
	a.mu.Lock()
	addr := a.ln.Addr().String()
	a.ln.Close()
	a.ln = nil
	for c := range a.conns {
		c.SetLinger(0)
		c.Close()
	}
	a.mu.Unlock()
	// The app's down time, as the kubelet takes to restart it.
	time.Sleep(down)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.ln = ln
	a.mu.Unlock()
	go a.accept(ln)
	return nil
}
