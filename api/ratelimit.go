package api

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/time/rate"
)

// subjectLimiter is a token bucket per subject. Buckets idle long enough to
// be full again are dropped, so the map holds only active subjects.
type subjectLimiter struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	used time.Time
}

// newSubjectLimiter returns nil (no limit) for a rate of 0 or less.
func newSubjectLimiter(perSecond float64, burst int) *subjectLimiter {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	return &subjectLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[string]*bucket{}}
}

// take spends one token of subject's bucket, or says how long until one is
// available.
func (l *subjectLimiter) take(subject string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b, ok := l.buckets[subject]
	if !ok {
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[subject] = b
	}
	b.used = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// sweep drops, at most once a minute, buckets unused for longer than it
// takes to refill them: a new bucket starts full, so nothing is lost.
func (l *subjectLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	refill := time.Duration(float64(l.burst) / float64(l.limit) * float64(time.Second))
	for k, b := range l.buckets {
		if now.Sub(b.used) > refill {
			delete(l.buckets, k)
		}
	}
}

// limits are the load limits of one server.
type limits struct {
	subjects *subjectLimiter // non-admin writes
	admins   *subjectLimiter // admin writes
	reads    *subjectLimiter // non-admin reads
	inflight chan struct{}   // nil: unbounded
	// perSubject counts the claims each non-admin subject has in flight;
	// nil: unbounded.
	perSubject *subjectInflight
}

func newLimits(sec Security) *limits {
	l := &limits{
		subjects: newSubjectLimiter(sec.RatePerSubject, sec.RateBurst),
		admins:   newSubjectLimiter(sec.AdminRatePerSubject, int(math.Ceil(2*sec.AdminRatePerSubject))),
		reads:    newSubjectLimiter(sec.ReadRatePerSubject, sec.ReadBurst),
	}
	if sec.MaxInflightClaims > 0 {
		l.inflight = make(chan struct{}, sec.MaxInflightClaims)
	}
	if sec.MaxInflightClaimsPerSubject > 0 {
		l.perSubject = &subjectInflight{max: sec.MaxInflightClaimsPerSubject, n: map[string]int{}}
	}
	return l
}

// subjectInflight counts claims in flight per subject; a subject with
// none has no entry, so the map holds only subjects waiting on Temporal.
type subjectInflight struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// take counts one more claim of subject unless it already has max.
func (s *subjectInflight) take(subject string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[subject] >= s.max {
		return false
	}
	s.n[subject]++
	return true
}

func (s *subjectInflight) give(subject string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[subject]--; s.n[subject] <= 0 {
		delete(s.n, subject)
	}
}

// rateLimit answers 429 with Retry-After when the caller's bucket is empty:
// writes count against the write buckets (an admin's own), reads of a
// non-admin against the read bucket; admins' reads are not limited.
func (g *guard) rateLimit(c *gin.Context, p Principal, write bool) bool {
	lim, what := g.limits.subjects, "write"
	switch {
	case write && p.Admin():
		lim = g.limits.admins
	case !write && p.Admin():
		return true
	case !write:
		lim, what = g.limits.reads, "read"
	}
	if lim == nil {
		return true
	}
	ok, wait := lim.take(p.Subject, time.Now())
	if ok {
		return true
	}
	g.shed.WithLabelValues("rate_limited").Inc()
	c.Header("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
	writeError(c, http.StatusTooManyRequests, "rate_limited",
		"too many "+what+" requests for this subject; retry after the Retry-After seconds", "")
	return false
}

// acquireClaim takes a slot toward Temporal without waiting: one of the
// subject's own (admins have no such bound, as they have no write bucket
// by default), then one of the server's. When either is full the request
// is shed with 429 at once, holding neither.
func (g *guard) acquireClaim(c *gin.Context, p Principal) (release func(), ok bool) {
	release = func() {}
	if ps := g.limits.perSubject; ps != nil && !p.Admin() {
		if !ps.take(p.Subject) {
			g.shedClaim(c, "subject_inflight", "too_many_in_flight",
				"this subject has too many claims waiting on Temporal; retry after the Retry-After seconds")
			return nil, false
		}
		release = func() { ps.give(p.Subject) }
	}
	if g.limits.inflight == nil {
		return release, true
	}
	select {
	case g.limits.inflight <- struct{}{}:
		subject := release
		return func() { <-g.limits.inflight; subject() }, true
	default:
		release()
		g.shedClaim(c, "overloaded", "overloaded", "too many claims in flight; retry after the Retry-After seconds")
		return nil, false
	}
}

// shedClaim is the one answer of a claim refused for want of a slot: 429
// with Retry-After 1 (a slot frees as soon as a claim is decided), counted
// by reason in claimflow_http_shed_total.
func (g *guard) shedClaim(c *gin.Context, reason, code, message string) {
	g.shed.WithLabelValues(reason).Inc()
	c.Header("Retry-After", "1")
	writeError(c, http.StatusTooManyRequests, code, message, "")
}
