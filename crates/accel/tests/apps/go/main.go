// The app the accelerator's tests put behind qproxy: echoes, sized and
// chunked bodies, a raw upgrade that echoes bytes until the client
// half-closes, and a slow reader.
package main

import (
	"bufio"
	"bytes"
	"os"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"
)

// pattern is the byte at offset i of every body the tests compare.
func pattern(i int64) byte { return byte((i*7 + i/251) % 256) }

func fill(buf []byte, off int64) {
	for j := range buf {
		buf[j] = pattern(off + int64(j))
	}
}

func intParam(r *http.Request, name string, def int64) int64 {
	v, err := strconv.ParseInt(r.URL.Query().Get(name), 10, 64)
	if err != nil {
		return def
	}
	return v
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	id := flag.String("id", "app", "what / answers, to tell apps apart")
	churn := flag.Int("churn", 0, "instead of serving: make this many short connections to -addr, GET / on each, and exit")
	hold := flag.Int("hold", 0, "instead of serving: open this many connections to -addr, GET / twice on each while all are open, and exit")
	flag.Parse()
	if *churn > 0 {
		os.Exit(shortConnections(*addr, *churn))
	}
	if *hold > 0 {
		os.Exit(heldConnections(*addr, *hold))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, *id+"\n")
	})
	// The request body back, as it arrives.
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		if r.ContentLength >= 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(r.ContentLength, 10))
		}
		io.Copy(w, r.Body)
	})
	// n bytes of the pattern, with a Content-Length.
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n := intParam(r, "n", 0)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := make([]byte, 64*1024)
		for off := int64(0); off < n; {
			k := min(int64(len(buf)), n-off)
			fill(buf[:k], off)
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			off += k
		}
	})
	// n bytes of the pattern, chunked, flushed every chunk bytes.
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		n, chunk := intParam(r, "n", 0), max(intParam(r, "chunk", 1000), 1)
		buf := make([]byte, chunk)
		for off := int64(0); off < n; {
			k := min(chunk, n-off)
			fill(buf[:k], off)
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			off += k
		}
	})
	// The body's length and SHA-256, read at most rate bytes a second.
	mux.HandleFunc("/sum", func(w http.ResponseWriter, r *http.Request) {
		rate := intParam(r, "rate", 0)
		h := sha256.New()
		buf := make([]byte, 16*1024)
		var total int64
		for {
			k, err := r.Body.Read(buf)
			h.Write(buf[:k])
			total += int64(k)
			if rate > 0 && k > 0 {
				time.Sleep(time.Duration(int64(k) * int64(time.Second) / rate))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
		}
		fmt.Fprintf(w, "%d %s\n", total, hex.EncodeToString(h.Sum(nil)))
	})
	// Switches protocols, then echoes bytes until the client half-closes,
	// and half-closes in turn.
	mux.HandleFunc("/upgrade", func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
		rw.Flush()
		echo(rw.Reader, conn)
	})
	srv := &http.Server{Addr: *addr, Handler: mux}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))
}

// echo copies what the client sends back to it with plain reads and
// writes (never splice), then closes its writing side.
func echo(in *bufio.Reader, conn net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		k, err := in.Read(buf)
		if k > 0 {
			if _, werr := conn.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// shortConnections opens n connections to addr one after another, each
// from one of 200 loopback source addresses (so that ports in TIME_WAIT do
// not run out), sends GET / with Connection: close and reads to EOF. It
// returns the exit code: 0 when every answer was a 200.
func shortConnections(addr string, n int) int {
	target, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		log.Print(err)
		return 2
	}
	failed := 0
	for i := 0; i < n; i++ {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i%200+1))}
		conn, err := net.DialTCP("tcp", src, target)
		if err != nil {
			log.Printf("connection %d: %v", i, err)
			failed++
			continue
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		answer, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || !bytes.HasPrefix(answer, []byte("HTTP/1.1 200")) {
			log.Printf("connection %d: %v %q", i, err, answer)
			failed++
		}
	}
	if failed > 0 {
		log.Printf("%d of %d connections failed", failed, n)
		return 1
	}
	return 0
}

// heldConnections opens n keep-alive connections to addr, all at once,
// and sends GET / twice on each; it returns 0 when every answer was a 200.
func heldConnections(addr string, n int) int {
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			log.Printf("connection %d: %v", i, err)
			return 1
		}
		conns = append(conns, c)
	}
	for round := 0; round < 2; round++ {
		for i, c := range conns {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				log.Printf("connection %d, round %d: %v", i, round, err)
				return 1
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return 0
}
