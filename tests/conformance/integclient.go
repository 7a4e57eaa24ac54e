package main

// The integrity suite's clients (integrity.go): HTTP/1.1 on raw TCP, the
// case's bytes written as given; HTTP/2 frame by frame, on the x/net
// framer. Each reads what comes back and says whether each response came
// whole: its framing ended it (the last chunk, the last Content-Length
// byte, END_STREAM).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientSaw is what a client saw of a case.
type clientSaw struct {
	// Warmup is the warm-up's status, in a warm play.
	Warmup string `json:"warmup,omitempty"`
	// Responses, in order.
	Responses []clientResponse `json:"responses"`
	// End is how the client's connection ended (or "open").
	End string `json:"end"`
	// closing: the last response said the connection ends.
	closing bool
}

// clientResponse is one answer the client read.
type clientResponse struct {
	Status int `json:"status"`
	// Whole: its framing ended it.
	Whole bool   `json:"whole"`
	Body  string `json:"body"`
	// Error ended it short.
	Error string `json:"error,omitempty"`
}

// success says whether the first response is a 2xx that came whole.
func (s clientSaw) success() bool {
	return len(s.Responses) > 0 && s.Responses[0].Whole && s.Responses[0].Status/100 == 2
}

// wholeResponse says whether any response came whole.
func (s clientSaw) wholeResponse() bool {
	for _, r := range s.Responses {
		if r.Whole {
			return true
		}
	}
	return false
}

// caseDeadline bounds a case's client.
const caseDeadline = 3 * time.Second

// playH1 plays an HTTP/1.1 case on the proxy's main port; in a warm play
// its connection first serves a GET of warmPath.
func playH1(c *integCase, warm bool) clientSaw {
	var saw clientSaw
	conn, br, err := openH1(warm, &saw)
	if err != nil {
		saw.End = errClass(err)
		return saw
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(caseDeadline))
	for _, w := range c.Writes {
		if _, err := conn.Write([]byte(w)); err != nil {
			break
		}
	}
	if c.CloseWrite {
		conn.(*net.TCPConn).CloseWrite()
	}
	for len(saw.Responses) < c.Responses {
		res, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			saw.End = errClass(err)
			return saw
		}
		data, err := io.ReadAll(res.Body)
		// Whole only when its framing ended it: a body that runs to the
		// connection's close cannot tell its end from a cut.
		framed := res.ContentLength >= 0 || len(res.TransferEncoding) > 0
		r := clientResponse{Status: res.StatusCode, Whole: err == nil && framed, Body: printable(data)}
		if err != nil {
			r.Error = errClass(err)
		}
		saw.Responses = append(saw.Responses, r)
		saw.closing = res.Close
		if err != nil || res.Close {
			break
		}
	}
	last := saw.Responses[len(saw.Responses)-1]
	if len(saw.Responses) == c.Responses && last.Whole && !saw.closing && len(c.Sent) > 0 {
		// A request sent whole, answered in full and kept alive: nothing
		// to wait for.
		saw.End = "open"
		return saw
	}
	// The connection is to end, or should (the client broke its request,
	// and where a next one would start is unknown): see whether it does.
	conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := br.Peek(1); err == nil {
		saw.End = "more bytes"
	} else {
		saw.End = errClass(err)
	}
	return saw
}

// openH1 dials the main port; in a warm play the connection serves a GET
// of warmPath first (if the proxy closes it after, a new one is dialled:
// the proxy's pool is warm all the same).
func openH1(warm bool, saw *clientSaw) (net.Conn, *bufio.Reader, error) {
	for try := 0; ; try++ {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:8012", 2*time.Second)
		if err != nil {
			return nil, nil, err
		}
		br := bufio.NewReader(conn)
		if !warm || try > 0 {
			return conn, br, nil
		}
		conn.SetDeadline(time.Now().Add(caseDeadline))
		conn.Write([]byte("GET " + warmPath + " HTTP/1.1\r\nHost: example.com\r\n\r\n"))
		res, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err == nil {
			_, err = io.Copy(io.Discard, res.Body)
			saw.Warmup = strconv.Itoa(res.StatusCode)
			if err == nil && !res.Close {
				return conn, br, nil
			}
		} else {
			saw.Warmup = errClass(err)
		}
		conn.Close()
	}
}

// h2Client is an HTTP/2 client connection, frame by frame.
type h2Client struct {
	conn net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	buf  bytes.Buffer
	// The peer's send windows: the connection's, and the initial one of a
	// stream, as SETTINGS set it.
	connWindow, initialWindow int64
	streamWindow              map[uint32]int64
	// What came back, by stream.
	responses map[uint32]*h2Response
}

// h2Response is an answer on one stream.
type h2Response struct {
	status int
	body   []byte
	ended  bool
	reset  string
}

func dialH2() (*h2Client, error) {
	conn, err := net.DialTimeout("tcp", "127.0.0.1:8012", 2*time.Second)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(caseDeadline))
	c := &h2Client{conn: conn, connWindow: 65535, initialWindow: 65535,
		streamWindow: map[uint32]int64{}, responses: map[uint32]*h2Response{}}
	c.enc = hpack.NewEncoder(&c.buf)
	c.fr = http2.NewFramer(conn, conn)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	conn.Write([]byte(http2.ClientPreface))
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	c.fr.WriteWindowUpdate(0, 1<<30)
	return c, nil
}

// headers sends a HEADERS frame on stream.
func (c *h2Client) headers(stream uint32, method, path string, fields [][2]string, end bool) {
	c.buf.Reset()
	for _, f := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "example.com"}, {":path", path}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for _, f := range fields {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.streamWindow[stream] = c.initialWindow
	c.responses[stream] = &h2Response{}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: c.buf.Bytes(), EndHeaders: true, EndStream: end})
}

// trailers sends a HEADERS frame of trailers, ending stream.
func (c *h2Client) trailers(stream uint32, fields [][2]string) {
	c.buf.Reset()
	for _, f := range fields {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: c.buf.Bytes(), EndHeaders: true, EndStream: true})
}

// data sends data on stream in frames the peer's windows allow, reading
// frames while they are shut; END_STREAM on the last frame when end.
func (c *h2Client) data(stream uint32, data []byte, end bool) error {
	for len(data) > 0 || end {
		n := min(len(data), 16384)
		for int64(n) > min(c.connWindow, c.streamWindow[stream]) {
			if err := c.read(); err != nil {
				return err
			}
			if r := c.responses[stream]; r.ended || r.reset != "" {
				return nil
			}
		}
		last := end && n == len(data)
		if err := c.fr.WriteData(stream, last, data[:n]); err != nil {
			return err
		}
		c.connWindow -= int64(n)
		c.streamWindow[stream] -= int64(n)
		data = data[n:]
		if last {
			return nil
		}
	}
	return nil
}

// read reads and handles one frame.
func (c *h2Client) read() error {
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			for s := range c.streamWindow {
				c.streamWindow[s] += int64(v) - c.initialWindow
			}
			c.initialWindow = int64(v)
		}
		c.fr.WriteSettingsAck()
	case *http2.PingFrame:
		if !f.IsAck() {
			c.fr.WritePing(true, f.Data)
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.connWindow += int64(f.Increment)
		} else {
			c.streamWindow[f.StreamID] += int64(f.Increment)
		}
	case *http2.MetaHeadersFrame:
		if r := c.responses[f.StreamID]; r != nil {
			if s := f.PseudoValue("status"); s != "" {
				r.status, _ = strconv.Atoi(s)
				if r.status/100 == 1 {
					r.status = 0
					return nil
				}
			}
			r.ended = r.ended || f.StreamEnded()
		}
	case *http2.DataFrame:
		if r := c.responses[f.StreamID]; r != nil {
			r.body = append(r.body, f.Data()...)
			r.ended = r.ended || f.StreamEnded()
		}
	case *http2.RSTStreamFrame:
		if r := c.responses[f.StreamID]; r != nil {
			r.reset = f.ErrCode.String()
		}
	case *http2.GoAwayFrame:
		return fmt.Errorf("goaway %s", f.ErrCode)
	}
	return nil
}

// await reads until stream's response has ended or been reset.
func (c *h2Client) await(stream uint32) error {
	for {
		if r := c.responses[stream]; r.ended || r.reset != "" {
			return nil
		}
		if err := c.read(); err != nil {
			return err
		}
	}
}

// playH2 plays an HTTP/2 case on the proxy's main port (prior
// knowledge); in a warm play a GET of warmPath goes on the connection
// first.
func playH2(ic *integCase, warm bool) clientSaw {
	var saw clientSaw
	c, err := dialH2()
	if err != nil {
		saw.End = errClass(err)
		return saw
	}
	defer c.conn.Close()
	stream := uint32(1)
	if warm {
		c.headers(stream, "GET", warmPath, nil, true)
		if err := c.await(stream); err != nil {
			saw.Warmup = errClass(err)
		} else {
			saw.Warmup = strconv.Itoa(c.responses[stream].status)
		}
		stream += 2
	}
	p := ic.H2
	data := []byte(p.Data[:p.Cut])
	c.headers(stream, p.Method, p.Path, p.Fields, p.End == "end" && len(data) == 0)
	err = c.data(stream, data, p.End == "end" && len(data) > 0)
	if err == nil {
		switch p.End {
		case "trailers":
			c.trailers(stream, p.Trailers)
		case "rst":
			// The stream is over for the client: what came before the
			// reset is all it sees.
			c.fr.WriteRSTStream(stream, http2.ErrCodeCancel)
			saw.End = "reset by the client"
		case "close":
			saw.End = "closed by the client"
			c.conn.Close()
			return saw
		}
		if p.End != "rst" {
			err = c.await(stream)
		}
	}
	r := c.responses[stream]
	if r.status != 0 || len(r.body) > 0 {
		res := clientResponse{Status: r.status, Whole: r.ended, Body: printable(r.body)}
		if r.reset != "" {
			res.Error = "stream-reset " + r.reset
		} else if !r.ended && err != nil {
			res.Error = errClass(err)
		}
		saw.Responses = append(saw.Responses, res)
	}
	switch {
	case saw.End != "":
	case err == nil:
		saw.End = "open"
	case errors.Is(err, io.EOF):
		saw.End = "closed"
	default:
		saw.End = errClass(err)
	}
	return saw
}
