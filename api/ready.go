package api

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
)

// readyTTL is how long /readyz answers from its last round of checks: a
// flood of probes (or of anyone, on the public address) costs the
// dependencies one round a second.
const readyTTL = time.Second

// readyTimeout bounds one round of checks.
const readyTimeout = 3 * time.Second

// readiness runs the checks at most once per readyTTL and remembers the
// outcome.
type readiness struct {
	checks map[string]Check
	now    func() time.Time
	onFail func(name string, err error)

	mu      sync.Mutex // held while a round runs: concurrent probes share it
	at      time.Time
	results map[string]error
}

// results are the outcome of the last round, or of a new one when the last
// is older than readyTTL. The round runs on a context of its own (bounded by
// readyTimeout), so a probe that hangs up does not fail it for the next
// second's probes.
func (r *readiness) check() map[string]error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.results != nil && r.now().Sub(r.at) < readyTTL {
		return r.results
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	results := make(map[string]error, len(r.checks))
	var (
		wg  sync.WaitGroup
		rmu sync.Mutex
	)
	for name, check := range r.checks {
		wg.Go(func() {
			err := check(ctx)
			rmu.Lock()
			results[name] = err
			rmu.Unlock()
		})
	}
	wg.Wait()
	for name, err := range results {
		if err != nil && r.onFail != nil {
			r.onFail(name, err)
		}
	}
	r.results, r.at = results, r.now()
	return results
}

// readyHandler answers /readyz: 200 when every check passed, else 503. With
// detail (the internal address) a failed check shows its error; otherwise
// only "failed", as the error text can name hosts, users and versions.
func (r *readiness) handler(detail bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		status := http.StatusOK
		out := gin.H{}
		for name, err := range r.check() {
			switch {
			case err == nil:
				out[name] = "ok"
				continue
			case detail:
				out[name] = err.Error()
			default:
				out[name] = "failed"
			}
			status = http.StatusServiceUnavailable
		}
		c.JSON(status, gin.H{"checks": out})
	}
}
