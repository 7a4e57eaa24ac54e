package main

// The integrity suite's app (integrity.go): it records every request a
// proxy brings it, as the bytes came: HTTP/1.1 read by a strict parser of
// its own (one framing, CRLF line ends, no folding, no space before a
// colon, exactly one Content-Length or a Transfer-Encoding that is
// exactly "chunked", never both), HTTP/2 (prior knowledge, as both proxies
// speak h2c to an app) read frame by frame. A request is complete only
// when its framing ended it: the last chunk and its trailers, the last
// Content-Length byte, END_STREAM with as many bytes as content-length
// said. Bytes a strict reader refuses end the connection and are noted as
// a violation: a proxy must never write them.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// wireRequest is one request as the app read it.
type wireRequest struct {
	// Proto is h1 or h2; Conn the number of the connection it came on.
	Proto string
	Conn  int
	// Method and Target, from the request line or the pseudo-headers.
	Method, Target string
	Headers        [][2]string
	Body           []byte
	Trailers       [][2]string
	// Complete: its framing ended it.
	Complete bool
	// Violation names what was not strict HTTP, if anything.
	Violation string
	// Reset is the RST_STREAM code an HTTP/2 request ended with.
	Reset string
}

// header is the value of the first field named name.
func (r *wireRequest) header(name string) string {
	for _, h := range r.Headers {
		if strings.EqualFold(h[0], name) {
			return h[1]
		}
	}
	return ""
}

// recorder is the app: a listener, and what its connections brought.
type recorder struct {
	listener net.Listener
	Port     int

	mu    sync.Mutex
	reqs  []*wireRequest
	conns int
	// open counts connections open now; partial, those holding part of a
	// request.
	open    int
	partial map[int]bool
}

// startRecorder listens on a free loopback port.
func startRecorder() (*recorder, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &recorder{listener: l, Port: l.Addr().(*net.TCPAddr).Port, partial: map[int]bool{}}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return r, nil
}

// Take returns and forgets what has been recorded.
func (r *recorder) Take() []*wireRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// quiet says whether no connection holds part of a request.
func (r *recorder) quiet() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.partial) == 0
}

// closed says whether every connection has ended.
func (r *recorder) closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.open == 0
}

func (r *recorder) add(req *wireRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
}

func (r *recorder) setPartial(conn int, partial bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if partial {
		r.partial[conn] = true
	} else {
		delete(r.partial, conn)
	}
}

func (r *recorder) serve(c net.Conn) {
	r.mu.Lock()
	r.conns++
	id := r.conns
	r.open++
	r.mu.Unlock()
	defer func() {
		c.Close()
		r.mu.Lock()
		r.open--
		delete(r.partial, id)
		r.mu.Unlock()
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	if preface, err := br.Peek(len(http2.ClientPreface)); err == nil && string(preface) == http2.ClientPreface {
		br.Discard(len(preface))
		r.serveH2(id, c, br)
		return
	}
	r.serveH1(id, c, br)
}

// errViolation marks bytes a strict reader refuses.
type errViolation string

func (e errViolation) Error() string { return string(e) }

// readLine reads one line, which must end in CRLF and hold no other CR or
// LF.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return "", errViolation("a line over 64 KiB")
	}
	if err != nil {
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", errViolation("a line ending in a bare LF")
	}
	text := string(line[:len(line)-2])
	if strings.ContainsAny(text, "\r\n") {
		return "", errViolation("a bare CR in a line")
	}
	return text, nil
}

const tokenChars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(tokenChars, s[i]) < 0 {
			return false
		}
	}
	return true
}

// readFields reads header (or trailer) lines up to the empty line.
func readFields(br *bufio.Reader) ([][2]string, error) {
	var fields [][2]string
	for {
		line, err := readLine(br)
		if err != nil {
			return fields, err
		}
		if line == "" {
			return fields, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return fields, errViolation("an obs-folded line")
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !isToken(name) {
			return fields, errViolation(fmt.Sprintf("a field line that is not name: value (%q)", line))
		}
		value = strings.Trim(value, " \t")
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
				return fields, errViolation("a control byte in a field value")
			}
		}
		fields = append(fields, [2]string{name, value})
	}
}

// framing is how a strict reader frames a request body from its fields:
// "none", "length" (with n) or "chunked".
func framing(fields [][2]string) (string, int64, error) {
	var lengths, codings []string
	for _, f := range fields {
		switch strings.ToLower(f[0]) {
		case "content-length":
			lengths = append(lengths, f[1])
		case "transfer-encoding":
			codings = append(codings, f[1])
		}
	}
	switch {
	case len(codings) > 0 && len(lengths) > 0:
		return "", 0, errViolation("Content-Length with Transfer-Encoding")
	case len(codings) > 1:
		return "", 0, errViolation("Transfer-Encoding twice")
	case len(codings) == 1:
		if codings[0] != "chunked" {
			return "", 0, errViolation(fmt.Sprintf("Transfer-Encoding %q", codings[0]))
		}
		return "chunked", 0, nil
	case len(lengths) > 1:
		return "", 0, errViolation("Content-Length twice")
	case len(lengths) == 1:
		v := lengths[0]
		if v == "" || len(v) > 18 || strings.Trim(v, "0123456789") != "" {
			return "", 0, errViolation(fmt.Sprintf("Content-Length %q", v))
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		return "length", n, nil
	}
	return "none", 0, nil
}

// readChunked reads a chunked body into req, its trailers too.
func readChunked(br *bufio.Reader, req *wireRequest) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		size, _, _ := strings.Cut(line, ";")
		if size == "" || len(size) > 15 || strings.Trim(size, "0123456789abcdefABCDEF") != "" {
			return errViolation(fmt.Sprintf("a chunk size line %q", line))
		}
		n, _ := strconv.ParseInt(size, 16, 64)
		if n == 0 {
			req.Trailers, err = readFields(br)
			return err
		}
		if err := readBody(br, req, n); err != nil {
			return err
		}
		end := make([]byte, 2)
		if _, err := io.ReadFull(br, end); err != nil {
			return err
		}
		if string(end) != "\r\n" {
			return errViolation("chunk data longer than its size")
		}
	}
}

// readBody reads n more bytes of req's body as they come, growing it by
// what came (a size a proxy passed on untouched is never allocated ahead).
func readBody(br *bufio.Reader, req *wireRequest, n int64) error {
	var b bytes.Buffer
	_, err := io.CopyN(&b, br, n)
	req.Body = append(req.Body, b.Bytes()...)
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// serveH1 reads requests on an HTTP/1.1 connection, answering each whole
// one (or, for a target asking it, each head at once).
func (r *recorder) serveH1(id int, c net.Conn, br *bufio.Reader) {
	for {
		if _, err := br.Peek(1); err != nil {
			return
		}
		r.setPartial(id, true)
		req := &wireRequest{Proto: "h1", Conn: id}
		err := readH1(br, req, func() { r.answerEarly(c, req) })
		r.setPartial(id, false)
		if req.Method != "" || err != nil {
			var v errViolation
			if errors.As(err, &v) {
				req.Violation = string(v)
			}
			r.add(req)
		}
		if err != nil {
			return
		}
		if !strings.Contains(req.Target, "early") && !r.answerH1(c, req) {
			return
		}
	}
}

// readH1 reads one request into req; head is called once its head is in.
func readH1(br *bufio.Reader, req *wireRequest, head func()) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	parts := strings.Split(line, " ")
	if len(parts) != 3 || !isToken(parts[0]) || parts[1] == "" || parts[2] != "HTTP/1.1" {
		return errViolation(fmt.Sprintf("a request line %q", line))
	}
	req.Method, req.Target = parts[0], parts[1]
	if req.Headers, err = readFields(br); err != nil {
		return err
	}
	kind, n, err := framing(req.Headers)
	if err != nil {
		return err
	}
	head()
	switch kind {
	case "length":
		if err := readBody(br, req, n); err != nil {
			return err
		}
	case "chunked":
		if err := readChunked(br, req); err != nil {
			return err
		}
	}
	req.Complete = true
	return nil
}

// answerEarly answers a request that asks for it as soon as its head is in.
func (r *recorder) answerEarly(c net.Conn, req *wireRequest) {
	if strings.Contains(req.Target, "early") {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly"))
	}
}

// answerH1 answers a whole request: by its target's response kind
// (/r/KIND, integcases.go), else with what it got. False when the
// connection is done.
func (r *recorder) answerH1(c net.Conn, req *wireRequest) bool {
	kind := responseKind(req.Target)
	var out string
	switch kind {
	case "chunked-bad-size":
		out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n"
	case "chunked-close":
		out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
	case "chunked-data-longer":
		out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello world\r\n0\r\n\r\n"
	case "cl-short":
		out = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten.."
	case "cl-short-large":
		out = "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + strings.Repeat("x", 70000)
	case "head-close":
		out = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
	default:
		body := answerBody(req)
		c.Write([]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)))
		return true
	}
	c.Write([]byte(out))
	return false
}

// answerBody is what the app answers a whole request with.
func answerBody(req *wireRequest) string {
	return fmt.Sprintf("got %d bytes", len(req.Body))
}

// responseKind is the response a target asks for: /r/KIND.
func responseKind(target string) string {
	if rest, ok := strings.CutPrefix(target, "/r/"); ok {
		kind, _, _ := strings.Cut(rest, "/")
		return kind
	}
	return ""
}

// h2Stream is a request in progress on an HTTP/2 connection.
type h2Stream struct {
	req      *wireRequest
	declared int64
	answered bool
}

// serveH2 reads requests on an HTTP/2 connection, frame by frame, with
// flow-control windows wide enough never to hold a proxy back.
func (r *recorder) serveH2(id int, c net.Conn, br *bufio.Reader) {
	fr := http2.NewFramer(c, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
	fr.WriteWindowUpdate(0, 1<<30)
	streams := map[uint32]*h2Stream{}
	var enc bytes.Buffer
	henc := hpack.NewEncoder(&enc)
	writeHeaders := func(stream uint32, end bool, fields ...string) {
		enc.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: enc.Bytes(), EndHeaders: true, EndStream: end})
	}
	update := func() {
		partial := false
		for _, s := range streams {
			partial = partial || !s.req.Complete
		}
		r.setPartial(id, partial)
	}
	var ended map[uint32]bool
	finish := func(stream uint32, s *h2Stream) {
		delete(streams, stream)
		ended[stream] = true
		r.add(s.req)
		if s.answered {
			return
		}
		switch responseKind(s.req.Target) {
		case "h2-rst-mid":
			writeHeaders(stream, false, ":status", "200", "content-length", "100")
			fr.WriteData(stream, false, []byte("only ten.."))
			fr.WriteRSTStream(stream, http2.ErrCodeInternal)
		case "h2-short-cl":
			writeHeaders(stream, false, ":status", "200", "content-length", "100")
			fr.WriteData(stream, true, []byte("only ten.."))
		case "h2-close-mid":
			writeHeaders(stream, false, ":status", "200", "content-length", "100")
			fr.WriteData(stream, false, []byte("only ten.."))
			c.Close()
		case "h2-rst-nocl":
			writeHeaders(stream, false, ":status", "200")
			fr.WriteData(stream, false, []byte("part of it"))
			fr.WriteRSTStream(stream, http2.ErrCodeInternal)
		default:
			body := answerBody(s.req)
			writeHeaders(stream, false, ":status", "200", "content-length", strconv.Itoa(len(body)))
			fr.WriteData(stream, true, []byte(body))
		}
	}
	defer func() {
		// Streams the connection's end left open never ended.
		for _, s := range streams {
			r.add(s.req)
		}
	}()
	// Streams that have ended: a frame for one again is no strict HTTP/2.
	ended = map[uint32]bool{}
	refuse := func(stream uint32, what string) {
		req := &wireRequest{Proto: "h2", Conn: id, Violation: what}
		if s, ok := streams[stream]; ok {
			req = s.req
			req.Violation = what
			req.Complete = false
			delete(streams, stream)
		}
		ended[stream] = true
		r.add(req)
		update()
	}
	for {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		f, err := fr.ReadFrame()
		var streamErr http2.StreamError
		if errors.As(err, &streamErr) {
			// A HEADERS block no strict reader takes (a field name in upper
			// case, a pseudo-header out of place, ...): the framer goes on.
			refuse(streamErr.StreamID, "a header block that is not HTTP/2: "+streamErr.Error())
			continue
		}
		if err != nil {
			for _, s := range streams {
				if s.req.Violation == "" && !errors.Is(err, io.EOF) && !isClosed(err) {
					s.req.Violation = "a frame that is not HTTP/2: " + err.Error()
				}
			}
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			stream := f.StreamID
			if ended[stream] {
				refuse(stream, "HEADERS on a stream that has ended")
				continue
			}
			if s, ok := streams[stream]; ok {
				// Trailers.
				for _, hf := range f.RegularFields() {
					s.req.Trailers = append(s.req.Trailers, [2]string{hf.Name, hf.Value})
				}
				if !f.StreamEnded() {
					s.req.Violation = "trailers without END_STREAM"
				} else {
					s.req.Complete = s.checkLength()
				}
				finish(stream, s)
				update()
				continue
			}
			req := &wireRequest{Proto: "h2", Conn: id, Method: f.PseudoValue("method"), Target: f.PseudoValue("path")}
			s := &h2Stream{req: req, declared: -1}
			for _, hf := range f.RegularFields() {
				req.Headers = append(req.Headers, [2]string{hf.Name, hf.Value})
				if hf.Name == "content-length" {
					s.declared, _ = strconv.ParseInt(hf.Value, 10, 64)
				}
			}
			streams[stream] = s
			if strings.Contains(req.Target, "early") {
				writeHeaders(stream, false, ":status", "200", "content-length", "5")
				fr.WriteData(stream, true, []byte("early"))
				s.answered = true
			}
			if f.StreamEnded() {
				req.Complete = s.checkLength()
				finish(stream, s)
			}
			update()
		case *http2.DataFrame:
			s, ok := streams[f.StreamID]
			if !ok {
				refuse(f.StreamID, "DATA on a stream that is not open")
				continue
			}
			s.req.Body = append(s.req.Body, f.Data()...)
			if f.StreamEnded() {
				s.req.Complete = s.checkLength()
				finish(f.StreamID, s)
			}
			update()
		case *http2.RSTStreamFrame:
			if s, ok := streams[f.StreamID]; ok {
				s.req.Reset = f.ErrCode.String()
				delete(streams, f.StreamID)
				ended[f.StreamID] = true
				r.add(s.req)
			}
			update()
		}
	}
}

// checkLength says whether a stream that ended holds what its
// content-length said; a stream that does not is noted as a violation.
func (s *h2Stream) checkLength() bool {
	if s.declared >= 0 && int64(len(s.req.Body)) != s.declared {
		s.req.Violation = fmt.Sprintf("END_STREAM after %d bytes of a content-length of %d", len(s.req.Body), s.declared)
		return false
	}
	return true
}

// isClosed says whether err is a read on a connection closed here.
func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
}
