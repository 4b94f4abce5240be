package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// h1Pool sends the load's enrollment POSTs over plain HTTP/1.1 keep-alive
// connections, one request at a time on each, as k6's VUs do. It does for
// these requests what net/http's client does, without its cost: one write
// and usually one read system call per request on the VU's own goroutine,
// where net/http's Transport hands each request to a connection's writer
// goroutine and its answer back from a reader goroutine. On a 2-core
// machine the generator shares the cores with the system under test, so
// its CPU per request is CPU the system does not get.
//
// Measured reason it stays (commit 3c1c7c0, burst at 2,000/s for 45 s, 3
// runs each, alternated with net/http's client): the generator's CPU per
// request fell from 187 µs (177–197) to 107 µs (105–107), from 18–19 % of
// the two cores to 10–11 %; claimflow's p50 went from 504 to 430 ms on
// that (overloaded) build. Both arms of a comparison use it.
//
// It speaks only what these requests need: POST with a JSON body, answers
// with Content-Length or chunked bodies, Connection: close. Anything else
// (https, a proxy) takes net/http (newH1Pool says so).
type h1Pool struct {
	addr    string // host:port to dial
	host    string // the Host header
	timeout time.Duration
	dialer  net.Dialer

	mu   sync.Mutex
	idle []*h1Conn
}

type h1Conn struct {
	c   net.Conn
	r   *bufio.Reader
	req []byte // the request being written, reused
}

// newH1Pool returns a pool for base (http://host[:port]) or false when base
// needs more than plain HTTP/1.1.
func newH1Pool(base string, timeout time.Duration) (*h1Pool, bool) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, false
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	return &h1Pool{addr: addr, host: u.Host, timeout: timeout, dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}}, true
}

// h1Error is a transport failure; Timeout reports a deadline that passed,
// so classify tells timeouts from other failures as it does for net/http.
type h1Error struct {
	op  string
	err error
}

func (e *h1Error) Error() string { return "http/1.1 " + e.op + ": " + e.err.Error() }
func (e *h1Error) Unwrap() error { return e.err }
func (e *h1Error) Timeout() bool {
	var ne net.Error
	return errors.As(e.err, &ne) && ne.Timeout()
}
func (e *h1Error) Temporary() bool { return false }

// post sends POST path with body and returns the status, the body and the
// Retry-After header (empty when absent). The whole exchange, dial
// included, is bounded by the pool's timeout and by ctx.
func (p *h1Pool) post(ctx context.Context, path, token string, body []byte) (int, []byte, string, error) {
	deadline := time.Now().Add(p.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for fresh := false; ; fresh = true {
		conn, reused, err := p.get(ctx, deadline, fresh)
		if err != nil {
			return 0, nil, "", &h1Error{"dial", err}
		}
		if err := conn.c.SetDeadline(deadline); err != nil {
			conn.c.Close()
			return 0, nil, "", &h1Error{"deadline", err}
		}
		// A cancelled run ends the exchange at once.
		stop := context.AfterFunc(ctx, func() { conn.c.SetDeadline(time.Unix(1, 0)) })
		status, raw, retry, keep, answered, err := conn.exchange(p.host, path, token, body)
		stopped := stop()
		if err != nil {
			conn.c.Close()
			if ctx.Err() != nil {
				err = ctx.Err()
			} else if reused && !answered && closedByPeer(err) {
				// The server closed the idle connection as the request
				// went out: not an answer, so send it again on a new one,
				// as net/http's Transport does.
				continue
			}
			return 0, nil, "", &h1Error{"exchange", err}
		}
		if keep && stopped {
			p.put(conn)
		} else {
			conn.c.Close()
		}
		return status, raw, retry, nil
	}
}

// closedByPeer tells an idle connection the server had closed.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// get takes an idle connection, unless fresh, or dials one; reused says
// which.
func (p *h1Pool) get(ctx context.Context, deadline time.Time, fresh bool) (*h1Conn, bool, error) {
	if !fresh {
		p.mu.Lock()
		if n := len(p.idle); n > 0 {
			c := p.idle[n-1]
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			return c, true, nil
		}
		p.mu.Unlock()
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := p.dialer.DialContext(dctx, "tcp", p.addr)
	if err != nil {
		return nil, false, err
	}
	return &h1Conn{c: c, r: bufio.NewReaderSize(c, 4096)}, false, nil
}

func (p *h1Pool) put(c *h1Conn) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// close closes the idle connections.
func (p *h1Pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
}

// exchange writes one request and reads its answer; keep says whether the
// connection may carry the next one, answered whether any of the answer
// arrived.
func (c *h1Conn) exchange(host, path, token string, body []byte) (status int, raw []byte, retryAfter string, keep, answered bool, err error) {
	b := c.req[:0]
	b = append(b, "POST "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: claimflow-bench\r\nContent-Type: application/json\r\n"...)
	if token != "" {
		b = append(b, "Authorization: Bearer "...)
		b = append(b, token...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.req = b
	if _, err := c.c.Write(b); err != nil {
		return 0, nil, "", false, false, err
	}

	line, err := c.line()
	if err != nil {
		// Nothing of the answer came (line drops a partial line).
		return 0, nil, "", false, false, err
	}
	answered = true
	// HTTP/1.1 201 Created
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, nil, "", false, true, fmt.Errorf("malformed status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, "", false, true, fmt.Errorf("malformed status line %q", line)
	}
	keep = line[7] == '1' // HTTP/1.0 closes unless told otherwise
	length, chunked := -1, false
	for {
		line, err := c.line()
		if err != nil {
			return 0, nil, "", false, true, err
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return 0, nil, "", false, true, fmt.Errorf("malformed header %q", line)
		}
		name, value := line[:colon], bytes.TrimSpace(line[colon+1:])
		switch {
		case asciiEqualFold(name, "Content-Length"):
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 {
				return 0, nil, "", false, true, fmt.Errorf("malformed Content-Length %q", value)
			}
			length = n
		case asciiEqualFold(name, "Transfer-Encoding"):
			if !asciiEqualFold(value, "chunked") {
				return 0, nil, "", false, true, fmt.Errorf("unsupported Transfer-Encoding %q", value)
			}
			chunked = true
		case asciiEqualFold(name, "Connection"):
			switch {
			case asciiEqualFold(value, "close"):
				keep = false
			case asciiEqualFold(value, "keep-alive"):
				keep = true
			}
		case asciiEqualFold(name, "Retry-After"):
			retryAfter = string(value)
		}
	}
	switch {
	case status/100 == 1:
		// No Expect header goes out, so no interim answer should come;
		// the final one would follow it on this connection.
		return 0, nil, "", false, true, fmt.Errorf("unexpected interim answer %d", status)
	case status == http.StatusNoContent || status == http.StatusNotModified:
		return status, nil, retryAfter, keep, true, nil
	case chunked:
		raw, err = c.chunks()
	case length >= 0:
		if length > maxAnswerBytes {
			return 0, nil, "", false, true, fmt.Errorf("answer of %d bytes", length)
		}
		raw = make([]byte, length)
		_, err = io.ReadFull(c.r, raw)
	default:
		// No length: the body runs to the connection's end.
		raw, err = io.ReadAll(io.LimitReader(c.r, maxAnswerBytes))
		keep = false
	}
	if err != nil {
		return 0, nil, "", false, true, err
	}
	return status, raw, retryAfter, keep, true, nil
}

// line reads one CRLF-terminated line without its terminator.
func (c *h1Conn) line() ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("header line longer than 4 KiB")
		}
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

// chunks reads a chunked body and its trailer.
func (c *h1Conn) chunks() ([]byte, error) {
	var body []byte
	for {
		line, err := c.line()
		if err != nil {
			return nil, err
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 32)
		if err != nil {
			return nil, fmt.Errorf("malformed chunk size %q", line)
		}
		if n == 0 {
			for {
				trailer, err := c.line()
				if err != nil {
					return nil, err
				}
				if len(trailer) == 0 {
					return body, nil
				}
			}
		}
		if len(body)+int(n) > maxAnswerBytes {
			return nil, fmt.Errorf("answer longer than %d bytes", maxAnswerBytes)
		}
		start := len(body)
		body = append(body, make([]byte, n)...)
		if _, err := io.ReadFull(c.r, body[start:]); err != nil {
			return nil, err
		}
		if crlf, err := c.line(); err != nil || len(crlf) != 0 {
			return nil, fmt.Errorf("chunk not followed by CRLF")
		}
	}
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
