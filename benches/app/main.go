// The app every contender of the benchmark fronts: Knative's helloworld-go
// shape (Hello World!), plus a body of a chosen size and a slow answer.
// HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on one port.
//
//	app -addr 127.0.0.1:8080
//
//	GET /                → "Hello World!\n"
//	GET /bytes?n=65536   → n bytes
//	GET /sleep?ms=10     → "slept\n" after ms milliseconds
//	GET /contended?work=100000&knee=64
//	                     → "done\n" after work × (1 + held/knee) rounds of
//	                       arithmetic, held being the requests inside at
//	                       arrival: an app whose CPU per request grows
//	                       with what it holds (contention, cache misses);
//	                       knee=0: work rounds, whatever it holds
//	GET /tunnel (Upgrade: websocket)
//	                     → 101, then every byte echoed until the client
//	                       stops sending: a tunnel's bulk stream
//	                       (?buffered: echoed through a 4 KiB buffer, not
//	                       spliced, for thousands of tunnels at once)
//	POST /grpc.health.v1.Health/Check → a gRPC unary answer (SERVING),
//	                       as a gRPC server frames it: length-prefixed
//	                       message, grpc-status in the trailers
package main

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
)

// spin does `rounds` rounds of arithmetic the compiler cannot skip,
// yielding every few thousand so that the requests inside share the CPU
// as threads would, rather than running one after the other.
func spin(rounds int) uint64 {
	x := uint64(rounds)
	for i := 0; i < rounds; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		if i%8192 == 8191 {
			runtime.Gosched()
		}
	}
	return x
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	big := bytes.Repeat([]byte("x"), 4<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("Hello World!\n"))
	})
	// An event sink: reads the body whole, as a CloudEvents receiver does.
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 || n > len(big) {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(big[:n])
	})
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		w.Write([]byte("slept\n"))
	})
	var held atomic.Int64
	mux.HandleFunc("/contended", func(w http.ResponseWriter, r *http.Request) {
		work, _ := strconv.Atoi(r.URL.Query().Get("work"))
		knee, err := strconv.Atoi(r.URL.Query().Get("knee"))
		if err != nil || knee < 0 || work < 0 {
			http.Error(w, "bad work or knee", http.StatusBadRequest)
			return
		}
		n := held.Add(1)
		defer held.Add(-1)
		rounds := float64(work)
		if knee > 0 {
			rounds *= 1 + float64(n)/float64(knee)
		}
		if spin(int(rounds)) == 42 {
			w.Header().Set("X-Lucky", "1")
		}
		w.Write([]byte("done\n"))
	})
	mux.HandleFunc("/tunnel", func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "cannot hijack", http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		// The key's answer, as RFC 6455 computes it.
		sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
			"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n")
		if rw.Flush() != nil {
			return
		}
		// What came with the head first, then the rest as it comes.
		if n := rw.Reader.Buffered(); n > 0 {
			ahead, _ := rw.Reader.Peek(n)
			if _, err := conn.Write(ahead); err != nil {
				return
			}
			rw.Reader.Discard(n)
		}
		if r.URL.Query().Has("buffered") {
			// Through a small buffer of the handler's own: Go's copy
			// between sockets splices, holding a pipe (two descriptors)
			// for each tunnel while it waits, and thousands of tunnels
			// ran the app out of descriptors.
			io.CopyBuffer(struct{ io.Writer }{conn}, struct{ io.Reader }{conn}, make([]byte, 4096))
		} else {
			io.Copy(conn, conn)
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			tcp.CloseWrite()
		}
	})
	// grpc.health.v1.HealthCheckResponse{status: SERVING}: field 1, varint 1.
	serving := []byte{0, 0, 0, 0, 2, 0x08, 0x01}
	mux.HandleFunc("/grpc.health.v1.Health/Check", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/grpc" {
			http.Error(w, "not gRPC", http.StatusUnsupportedMediaType)
			return
		}
		// The request is one framed message; read it all, as a server does.
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.Write(serving)
		w.Header().Set("Grpc-Status", "0")
	})
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	server := &http.Server{Addr: *addr, Handler: mux, Protocols: &protocols}
	log.Fatal(server.ListenAndServe())
}
