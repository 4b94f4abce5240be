// Package simserver is what the dev stack's HTTP simulators (notifysim,
// payoutsim) share: serving a handler on a local address until closed, a
// JSON duration for their mode settings, and a JSON answer.
package simserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Listener is a handler served on a local address.
type Listener struct {
	// URL is the base URL, e.g. http://127.0.0.1:8090.
	URL  string
	srv  *http.Server
	done chan struct{}
}

// Listen serves h on addr ("127.0.0.1:0" picks a free port); name says
// which simulator failed to listen.
func Listen(name, addr string, h http.Handler) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", name, addr, err)
	}
	l := &Listener{
		URL:  "http://" + ln.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(l.done)
		_ = l.srv.Serve(ln)
	}()
	return l, nil
}

// Close stops serving after the requests in flight; a nil Listener (a
// simulator that was never started) closes at once.
func (l *Listener) Close(ctx context.Context) error {
	if l == nil {
		return nil
	}
	err := l.srv.Shutdown(ctx)
	<-l.done
	return err
}

// Duration reads and writes "250ms" style JSON strings (or nanoseconds).
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err := json.Unmarshal(b, &n); err != nil {
			return errors.New(`delay must be a duration such as "250ms"`)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("delay: %w", err)
	}
	*d = Duration(v)
	return nil
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
