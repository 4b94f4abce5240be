package api

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

// policy is what a /v1 route demands beyond a valid token.
type policy struct {
	// admin: only role admin (otherwise any authenticated subject; the
	// handlers of enroll, cancel, issue and use check that a student acts
	// only as itself).
	admin bool
	// write: counts against the subject's rate limit.
	write bool
	// claim: starts, joins or signals a Temporal run, so it takes a slot
	// of MaxInflightClaims.
	claim bool
}

// routePolicies has one entry per /v1 route, keyed by method and gin route
// pattern. A route missing here is admin-only (fail closed); TestRoutePolicies
// makes sure none is missing and that openapi.json says the same.
var routePolicies = map[string]policy{
	"POST /v1/courses":                     {admin: true, write: true},
	"GET /v1/courses/:id":                  {},
	"POST /v1/courses/:id/enrollments":     {write: true, claim: true},
	"GET /v1/enrollments/:id":              {},
	"DELETE /v1/enrollments/:id":           {write: true, claim: true},
	"GET /v1/dead-letters":                 {admin: true},
	"GET /v1/dead-letters/:id":             {admin: true},
	"POST /v1/dead-letters/:id/retry":      {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/:id/compensate": {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/retry":          {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/compensate":     {admin: true, write: true, claim: true},
	"POST /v1/vendors":                     {admin: true, write: true},
	"GET /v1/vendors/:id":                  {},
	"POST /v1/coupon-types":                {admin: true, write: true},
	"GET /v1/coupon-types/:id":             {},
	"POST /v1/coupon-types/:id/coupons":    {write: true, claim: true},
	"GET /v1/coupons/:id":                  {},
	"POST /v1/coupons/:id/use":             {write: true, claim: true},
}

func policyOf(method, route string) policy {
	if p, ok := routePolicies[method+" "+route]; ok {
		return p
	}
	return policy{admin: true, write: method != http.MethodGet, claim: method != http.MethodGet}
}

// guard enforces authentication, the route's policy and the load limits.
type guard struct {
	limits *limits
	shed   *prometheus.CounterVec
}

// guard returns the middleware of the /v1 routes: authenticate, authorize
// by role, rate-limit writes per subject, bound the claims in flight.
func (s *server) guard() gin.HandlerFunc {
	g := &guard{
		limits: newLimits(s.Security),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_http_shed_total",
			Help: "Requests answered 429 by reason: rate_limited (per-subject write limit) or overloaded (claims in flight).",
		}, []string{"reason"}),
	}
	s.Metrics.MustRegister(g.shed)
	if s.Security.InsecureNoAuth {
		s.Log.Warn("AUTHENTICATION IS OFF (--insecure-no-auth): every request acts as an admin; " +
			"never expose this server beyond a sandbox")
	}
	return func(c *gin.Context) {
		s.authenticate(c)
		if c.IsAborted() {
			return
		}
		p := principalOf(c)
		pol := policyOf(c.Request.Method, c.FullPath())
		if pol.admin && !p.Admin() {
			writeError(c, http.StatusForbidden, "forbidden", "this operation needs role "+RoleAdmin, "")
			return
		}
		if pol.write && !g.rateLimit(c, p) {
			return
		}
		if pol.claim {
			release, ok := g.acquireClaim(c)
			if !ok {
				return
			}
			defer release()
		}
		c.Next()
	}
}
