package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxRetryAfter caps how long a VU honours one Retry-After, so that a
// misbehaving server cannot park the whole pool.
const maxRetryAfter = 30 * time.Second

// newHTTPClient keeps a connection per VU alive, as k6 does.
func newHTTPClient(maxVUs int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        maxVUs,
			MaxIdleConnsPerHost: maxVUs,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// createCourses makes the run's courses through the API under test, so
// both arms are prepared by the same code path.
func createCourses(ctx context.Context, c *http.Client, base, token string, ids []string, seats int) error {
	sem := make(chan struct{}, 8)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			body, _ := json.Marshal(map[string]any{"id": id, "title": "bench " + id, "capacity": seats})
			status, raw, _, err := post(ctx, c, base+"/v1/courses", token, body)
			if err == nil && status != http.StatusCreated {
				err = fmt.Errorf("POST /v1/courses %s answered %d: %s", id, status, bytes.TrimSpace(raw))
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// maxAnswerBytes bounds the body of an answer the bench reads, through
// net/http (post) or its own client (h1Pool).
const maxAnswerBytes = 1 << 20

// post sends JSON (with the bearer token, if any) and reads the whole
// answer, so the connection is reused.
func post(ctx context.Context, c *http.Client, url, token string, body []byte) (int, []byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	return resp.StatusCode, raw, resp.Header, err
}

// classify tells a timeout from any other transport failure.
func classify(err error) Outcome {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return OutcomeTimeout
	}
	return OutcomeConn
}

// retryAfter parses a Retry-After header: delta-seconds or an HTTP date.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return min(time.Duration(secs)*time.Second, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter), true
	}
	return 0, false
}

// enroller is the iteration of the user's scenario: one enrollment request
// (retried after Retry-After on 429/503), then the VU sleeps.
type enroller struct {
	client *http.Client
	// h1, when set, sends the enrollment POSTs, one pool per base
	// (h1client.go); client still sends everything else.
	h1 []*h1Pool
	// bases are the API processes, taken in turn by iteration; a request
	// that cannot connect to one goes to the next, as a client behind a
	// load balancer sees it.
	bases      []string
	token      string
	courses    []string
	students   int
	sleep      time.Duration
	maxRetries int
	start      time.Time
	rec        *Recorder
	// churn, holdSeat and waitlist: see Options.
	churn    float64
	holdSeat time.Duration
	waitlist bool

	retries    atomic.Int64
	cancelled  atomic.Int64 // enrollments the churn cancelled
	waitlisted atomic.Int64 // claims answered 202 waitlisted
	mu         sync.Mutex
	accepted   []string // enrollment IDs answered 201
}

// pick maps iteration n to a course and a student. Students are taken in
// order (n mod students), courses are spread by a mixing hash so that
// neighbouring iterations hit different course rows.
func (e *enroller) pick(n int) (course, student string) {
	x := uint64(n) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return e.courses[x%uint64(len(e.courses))], "s" + strconv.Itoa(n%e.students)
}

func (e *enroller) iteration(ctx context.Context, n int, _ time.Duration) {
	course, student := e.pick(n)
	body := []byte(`{"student_id":"` + student + `"}`)
	if e.waitlist {
		body = []byte(`{"student_id":"` + student + `","waitlist":true}`)
	}
	path := "/v1/courses/" + course + "/enrollments"
	for attempt := 0; ; attempt++ {
		began := time.Now()
		status, raw, header, err := e.post(ctx, n, path, body)
		ended := time.Now()
		s := Sample{End: ended.Sub(e.start), Latency: ended.Sub(began), Status: status}
		if err != nil {
			if ctx.Err() != nil {
				return // the run was cancelled: not the server's failure
			}
			s.Outcome = classify(err)
		}
		e.rec.Add(s)
		if err == nil {
			if id := acceptedID(status, raw, attempt > 0); id != "" {
				e.mu.Lock()
				e.accepted = append(e.accepted, id)
				e.mu.Unlock()
				if status == http.StatusAccepted && strings.Contains(string(raw), `"waitlisted"`) {
					e.waitlisted.Add(1)
				}
				if status == http.StatusCreated && e.churns(n) {
					e.cancel(ctx, e.bases[n%len(e.bases)], id)
				}
			}
		}
		if err != nil || (status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable) || attempt >= e.maxRetries {
			break
		}
		wait, ok := retryAfter(header, ended)
		if !ok {
			break
		}
		e.retries.Add(1)
		if !sleepCtx(ctx, wait) {
			return
		}
	}
	sleepCtx(ctx, e.sleep)
}

// useH1 sends the enrollment POSTs through the bench's own HTTP/1.1 client
// when base is plain http://host:port; the returned func closes it.
func (e *enroller) useH1(timeout time.Duration) (closeH1 func()) {
	var pools []*h1Pool
	for _, base := range e.bases {
		h1, ok := newH1Pool(base, timeout)
		if !ok {
			for _, p := range pools {
				p.close()
			}
			return func() {}
		}
		pools = append(pools, h1)
	}
	e.h1 = pools
	return func() {
		for _, p := range pools {
			p.close()
		}
	}
}

// post sends iteration n's enrollment POST to its base, through h1 when
// set, else through client. When the base refuses the connection (its
// process is down) and there is another, it goes there.
func (e *enroller) post(ctx context.Context, n int, path string, body []byte) (int, []byte, http.Header, error) {
	status, raw, h, err := e.postTo(ctx, n%len(e.bases), path, body)
	if err != nil && len(e.bases) > 1 && errors.Is(err, syscall.ECONNREFUSED) {
		return e.postTo(ctx, (n+1)%len(e.bases), path, body)
	}
	return status, raw, h, err
}

func (e *enroller) postTo(ctx context.Context, i int, path string, body []byte) (int, []byte, http.Header, error) {
	if e.h1 == nil {
		return post(ctx, e.client, e.bases[i]+path, e.token, body)
	}
	status, raw, retry, err := e.h1[i].post(ctx, path, e.token, body)
	var h http.Header
	if retry != "" {
		h = http.Header{"Retry-After": {retry}}
	}
	return status, raw, h, err
}

// churns says whether iteration n cancels its enrollment: a fraction churn
// of iterations, spread by the same mixing hash as pick.
func (e *enroller) churns(n int) bool {
	if e.churn <= 0 {
		return false
	}
	x := uint64(n)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return float64(x%1_000_000)/1_000_000 < e.churn
}

// cancel holds the seat for holdSeat, then gives it back: DELETE, retried
// after Retry-After while the enrollment is still being confirmed.
func (e *enroller) cancel(ctx context.Context, base, id string) {
	if !sleepCtx(ctx, e.holdSeat) {
		return
	}
	for attempt := 0; attempt < 20; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, base+"/v1/enrollments/"+id, nil)
		if err != nil {
			return
		}
		if e.token != "" {
			req.Header.Set("Authorization", "Bearer "+e.token)
		}
		resp, err := e.client.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			e.cancelled.Add(1)
			return
		case http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			wait, ok := retryAfter(resp.Header, time.Now())
			if !ok {
				wait = 200 * time.Millisecond
			}
			if !sleepCtx(ctx, wait) {
				return
			}
		default:
			return
		}
	}
}

// acceptedID returns the enrollment the client was given: the ID of a 201,
// or, on a retry after Retry-After, the enrollment a 409 already_enrolled
// names (the first attempt's claim went on after its 503, and the retry
// joined it).
func acceptedID(status int, body []byte, retry bool) string {
	var got struct {
		ID           string `json:"id"`
		EnrollmentID string `json:"enrollment_id"`
		Error        struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	switch {
	case status == http.StatusCreated, status == http.StatusAccepted:
		// 202: waitlisted, or under way and undecided; either way the
		// client holds the enrollment's ID.
		if json.Unmarshal(body, &got) == nil {
			return got.ID
		}
	case status == http.StatusConflict && retry:
		if json.Unmarshal(body, &got) == nil && got.Error.Code == "already_enrolled" {
			return got.EnrollmentID
		}
	}
	return ""
}

// Accepted is the enrollment IDs clients were given.
func (e *enroller) Accepted() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.accepted...)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
