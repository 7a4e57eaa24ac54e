package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

// AppConfig is how a scenario wants the user container to behave.
type AppConfig struct {
	// Down: nothing listens on the user port.
	Down bool `yaml:"down"`
	// ListenAfterMs: the port opens this long after the proxy is up.
	ListenAfterMs int `yaml:"listen_after_ms"`
}

// Seen is what the app observed of one request.
type Seen struct {
	Method  string
	Target  string
	Proto   string
	Host    string
	Headers http.Header
	Body    int
}

// App is the user container: a Go net/http server (HTTP/1.1 and h2c) whose
// answer depends on the request's path, recording every request it gets.
type App struct {
	listener net.Listener
	server   *http.Server
	Port     int
	begin    func()

	mu   sync.Mutex
	seen []Seen
	// custom, when set, answers every request instead.
	custom atomic.Pointer[http.Handler]
}

// SetHandler makes h answer every request (the failure-mode suite's apps).
func (a *App) SetHandler(h http.Handler) {
	a.custom.Store(&h)
}

// reservePort finds a free loopback port.
func reservePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartApp starts the app on a free port, now or after cfg.ListenAfterMs.
func StartApp(cfg AppConfig) (*App, error) {
	port, err := reservePort()
	if err != nil {
		return nil, err
	}
	app := &App{Port: port}
	if cfg.Down {
		return app, nil
	}
	h := h2c.NewHandler(http.HandlerFunc(app.serve), &http2.Server{})
	app.server = &http.Server{Handler: h}
	listen := func() error {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		app.mu.Lock()
		app.listener = l
		app.mu.Unlock()
		go app.server.Serve(l)
		return nil
	}
	if cfg.ListenAfterMs > 0 {
		delay := time.Duration(cfg.ListenAfterMs) * time.Millisecond
		app.begin = func() { time.AfterFunc(delay, func() { _ = listen() }) }
		return app, nil
	}
	return app, listen()
}

// Begin starts the clock of an app that listens late; the runner calls it
// once the proxy is up, so that the delay is the same for every proxy.
func (a *App) Begin() {
	if a.begin != nil {
		a.begin()
	}
}

// Stop closes the app's listener and connections.
func (a *App) Stop() {
	if a.server != nil {
		a.server.Close()
	}
}

// Seen returns and forgets what the app has recorded, requests the runner
// makes for its own checks (/__ping) left out.
func (a *App) Take() []Seen {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.seen
	a.seen = nil
	return out
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

func (a *App) serve(w http.ResponseWriter, r *http.Request) {
	if h := a.custom.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodConnect && r.ProtoMajor == 2 {
		a.tunnel(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/__ping" && r.URL.Path != warmPath {
		a.mu.Lock()
		a.seen = append(a.seen, Seen{
			Method: r.Method, Target: r.RequestURI, Proto: r.Proto, Host: r.Host,
			Headers: r.Header.Clone(), Body: len(body),
		})
		a.mu.Unlock()
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	arg := func(i int) int {
		if i < len(parts) {
			n, _ := strconv.Atoi(parts[i])
			return n
		}
		return 0
	}
	switch parts[0] {
	case "status":
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(arg(1))
		fmt.Fprintf(w, "status %d\n", arg(1))
	case "sleep":
		select {
		case <-time.After(time.Duration(arg(1)) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		fmt.Fprintln(w, "slept")
	case "stream":
		// stream/<chunks>/<ms between>: a response that starts at once and
		// trickles.
		flusher, _ := w.(http.Flusher)
		for i := 0; i < arg(1); i++ {
			fmt.Fprintf(w, "chunk %d\n", i)
			if flusher != nil {
				flusher.Flush()
			}
			select {
			case <-time.After(time.Duration(arg(2)) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	case "echo":
		w.Header().Set("Content-Type", "application/octet-stream")
		fmt.Fprintf(w, "%d bytes: %s", len(body), body)
	case "bytes":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write([]byte(strings.Repeat("x", arg(1))))
	case "hop":
		// Hop-by-hop headers the proxy must not pass on.
		w.Header().Set("Connection", "X-Private")
		w.Header().Set("X-Private", "secret")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Proxy-Connection", "keep-alive")
		w.Header().Set("Upgrade", "h2c")
		w.Header().Set("X-Kept", "yes")
		fmt.Fprintln(w, "hop")
	case "headers":
		w.Header().Set("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.Header().Set("Set-Cookie", "k=v; Path=/")
		w.Header().Set("x-lower-case", "kept")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "headers")
	case "fields":
		// N response header fields X-Field, each a value of LEN bytes.
		value := strings.Repeat("v", arg(2))
		for i := 0; i < arg(1); i++ {
			w.Header().Add("X-Field", value)
		}
		fmt.Fprintln(w, "fields")
	case "trailers":
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "body before trailers")
		w.Header().Set("X-Checksum", "abc123")
	case "redirect":
		http.Redirect(w, r, "/elsewhere", http.StatusMovedPermanently)
	case "crash":
		// The app dies mid-response: head and part of the body, then the
		// connection is cut.
		writeAndClose(w, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\npartial")
	case "http10":
		// An app that answers in HTTP/1.0 (Python's http.server does by
		// default) and closes its connection after, as HTTP/1.0 does.
		writeAndClose(w, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nhello\n")
	case "crash-before":
		// The app dies before answering.
		hj, ok := w.(http.Hijacker)
		if !ok {
			panic(http.ErrAbortHandler)
		}
		conn, _, err := hj.Hijack()
		if err == nil {
			conn.Close()
		}
	case "ws":
		conn, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			kind, msg, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if err := conn.WriteMessage(kind, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "hello")
	}
}

// writeAndClose takes the connection from Go's server, writes raw on it,
// and closes it.
func writeAndClose(w http.ResponseWriter, raw string) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	buf.WriteString(raw)
	buf.Flush()
	conn.Close()
}

// Describe turns what the app saw into observation fields.
// tunnel answers an HTTP/2 CONNECT as a tunnel's far end does: 200 at
// once, then an echo of what the client sends, to its end.
func (a *App) tunnel(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	n := 0
	buf := make([]byte, 16<<10)
	for {
		got, err := r.Body.Read(buf)
		n += got
		if got > 0 {
			w.Write(buf[:got])
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			break
		}
	}
	a.mu.Lock()
	a.seen = append(a.seen, Seen{
		Method: r.Method, Target: r.RequestURI, Proto: r.Proto, Host: r.Host,
		Headers: r.Header.Clone(), Body: n,
	})
	a.mu.Unlock()
}

func describeSeen(prefix string, seen []Seen, obs *Observation) {
	sort.SliceStable(seen, func(i, j int) bool { return seen[i].Target < seen[j].Target })
	obs.Set(prefix+"app.requests", strconv.Itoa(len(seen)))
	for i, s := range seen {
		p := fmt.Sprintf("%sapp[%d].", prefix, i)
		obs.Set(p+"method", s.Method)
		obs.Set(p+"target", s.Target)
		obs.Set(p+"proto", s.Proto)
		obs.Set(p+"host", s.Host)
		obs.Set(p+"body", strconv.Itoa(s.Body))
		for name, values := range s.Headers {
			value := strings.Join(values, " | ")
			if volatile[name] {
				value = "(present)"
			}
			obs.Set(p+"header."+name, value)
		}
	}
}
