package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// h1Server is a real net/http server that counts the connections it accepted.
func h1Server(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func TestH1PoolAnswers(t *testing.T) {
	long := strings.Repeat("x", 10_000) // beyond net/http's 2 KiB before it chunks
	for _, tc := range []struct {
		name      string
		handler   http.HandlerFunc
		status    int
		body      string
		retry     string
		wantConns int64 // after 5 requests in a row
	}{
		{"content-length, kept alive", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"e-1"}`)
		}, 201, `{"id":"e-1"}`, "", 1},
		{"chunked, kept alive", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, long[:5000])
			w.(http.Flusher).Flush()
			io.WriteString(w, long[5000:])
		}, 409, long, "", 1},
		{"Retry-After on 429", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"overloaded"}}`)
		}, 429, `{"error":{"code":"overloaded"}}`, "2", 1},
		{"server closes after each answer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"e-2"}`)
		}, 201, `{"id":"e-2"}`, "", 5},
		{"no body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}, 204, "", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, conns := h1Server(t, tc.handler)
			p, ok := newH1Pool(srv.URL, 5*time.Second)
			if !ok {
				t.Fatalf("newH1Pool(%q) refused a plain http URL", srv.URL)
			}
			defer p.close()
			for i := range 5 {
				status, body, retry, err := p.post(context.Background(), "/v1/courses/c1/enrollments", "tok", []byte(`{"student_id":"s1"}`))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if status != tc.status || string(body) != tc.body || retry != tc.retry {
					t.Fatalf("request %d: status %d, body %.40q (%d bytes), Retry-After %q; want %d, %.40q (%d bytes), %q",
						i, status, body, len(body), retry, tc.status, tc.body, len(tc.body), tc.retry)
				}
			}
			if got := conns.Load(); got != tc.wantConns {
				t.Errorf("5 requests took %d connections, want %d", got, tc.wantConns)
			}
		})
	}
}

// The server sees the request net/http's client would have sent.
func TestH1PoolRequest(t *testing.T) {
	type seen struct {
		method, path, host, auth, ctype, body string
		length                                int64
	}
	got := make(chan seen, 1)
	srv, _ := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Host, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b), r.ContentLength}
		w.WriteHeader(http.StatusCreated)
	})
	p, _ := newH1Pool(srv.URL, 5*time.Second)
	defer p.close()
	body := `{"student_id":"s7","waitlist":true}`
	if _, _, _, err := p.post(context.Background(), "/v1/courses/c9/enrollments", "abc.def", []byte(body)); err != nil {
		t.Fatal(err)
	}
	want := seen{"POST", "/v1/courses/c9/enrollments", strings.TrimPrefix(srv.URL, "http://"), "Bearer abc.def", "application/json", body, int64(len(body))}
	if g := <-got; g != want {
		t.Errorf("server saw %+v, want %+v", g, want)
	}
}

// A slow answer ends in a timeout (as classify sees it) and a cancelled run
// ends its request at once; neither connection is used again.
func TestH1PoolTimeoutAndCancel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv, conns := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	p, _ := newH1Pool(srv.URL, 200*time.Millisecond)
	defer p.close()
	began := time.Now()
	_, _, _, err := p.post(context.Background(), "/slow", "", nil)
	if err == nil || classify(err) != OutcomeTimeout {
		t.Fatalf("slow answer: err %v (outcome %v), want a timeout", err, classify(err))
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("the 200 ms timeout took %v", took)
	}

	p.timeout = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	began = time.Now()
	_, _, _, err = p.post(ctx, "/slow", "", nil)
	if err == nil || time.Since(began) > 10*time.Second {
		t.Fatalf("cancelled request: err %v after %v", err, time.Since(began))
	}
	if _, _, _, err := p.post(context.Background(), "/fast", "", nil); err != nil {
		t.Fatal(err)
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("3 requests, the first two broken off, took %d connections; want 3", got)
	}
}

func TestNewH1PoolTakesPlainHTTPOnly(t *testing.T) {
	for base, want := range map[string]bool{
		"http://127.0.0.1:8080":   true,
		"http://127.0.0.1:8080/":  true,
		"http://localhost":        true,
		"https://127.0.0.1:8443":  false,
		"http://127.0.0.1/prefix": false,
		"http://u:p@127.0.0.1":    false,
		"127.0.0.1:8080":          false,
	} {
		if _, ok := newH1Pool(base, time.Second); ok != want {
			t.Errorf("newH1Pool(%q) = %v, want %v", base, ok, want)
		}
	}
}

// A keep-alive connection the server closed while it was idle is not an
// answer: the request goes again on a new connection, as with net/http.
func TestH1PoolServerClosedIdleConnection(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.IdleTimeout = 50 * time.Millisecond
	srv.Start()
	defer srv.Close()
	p, _ := newH1Pool(srv.URL, 5*time.Second)
	defer p.close()
	for i := range 3 {
		status, _, _, err := p.post(context.Background(), "/x", "", nil)
		if err != nil || status != http.StatusCreated {
			t.Fatalf("request %d after the server closed the idle connection: %d, %v", i, status, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := served.Load(); n != 3 {
		t.Errorf("server served %d requests, want 3", n)
	}
}
