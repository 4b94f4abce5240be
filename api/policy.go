package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// policy is what a /v1 route demands beyond a valid token: who may read or
// act (exactly one of admin, catalogue, or an owner and/or actsAs rule —
// TestRoutePolicies holds that) and what it costs.
type policy struct {
	// admin: only role admin.
	admin bool
	// catalogue: any authenticated subject may read it; the answer carries
	// no one's personal data (a course, a coupon type).
	catalogue bool
	// owner names the rule (ownerRules) that says whose resource the path's
	// ID is. The handler reads the owner from the database before anything
	// else happens and answers anyone but the owner or an admin exactly as
	// a missing ID: 404 …_not_found.
	owner string
	// actsAs is the body field naming the student or user the request acts
	// as: a non-admin must name itself (403 forbidden on the field).
	actsAs string
	// write: counts against the subject's rate limit.
	write bool
	// claim: starts, joins or signals a Temporal run, so it takes a slot
	// of MaxInflightClaims (and of MaxInflightClaimsPerSubject).
	claim bool
}

// The owner rules, by the name routePolicies, openapi.json (x-owner) and
// docs/security.md use.
const (
	ownerEnrollment = "enrollment.student_id" // the enrollment's student
	ownerCoupon     = "coupon.user_id"        // the user the coupon was issued to
	ownerVendor     = "vendor.id"             // the vendor itself: a subject with role vendor and sub = the vendor's ID
	// The lists' owners: the student or user the path names, and the
	// recipient of a notification.
	ownerStudent      = "path.student_id"
	ownerUser         = "path.user_id"
	ownerNotification = "notification.recipient"
)

// routePolicies has one entry per /v1 route, keyed by method and gin route
// pattern. A route missing here is admin-only (fail closed); TestRoutePolicies
// makes sure none is missing and that openapi.json says the same, and
// cmd/claimflow's TestAuthzMatrix has a row for each.
var routePolicies = map[string]policy{
	"POST /v1/courses":                      {admin: true, write: true},
	"GET /v1/courses/:id":                   {catalogue: true},
	"PATCH /v1/courses/:id":                 {admin: true, write: true},
	"POST /v1/courses/:id/enrollments":      {actsAs: "student_id", write: true, claim: true},
	"GET /v1/enrollments/:id":               {owner: ownerEnrollment},
	"DELETE /v1/enrollments/:id":            {owner: ownerEnrollment, write: true, claim: true},
	"GET /v1/dead-letters":                  {admin: true},
	"GET /v1/dead-letters/:id":              {admin: true},
	"POST /v1/dead-letters/:id/retry":       {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/:id/compensate":  {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/retry":           {admin: true, write: true, claim: true},
	"POST /v1/dead-letters/compensate":      {admin: true, write: true, claim: true},
	"POST /v1/vendors":                      {admin: true, write: true},
	"GET /v1/vendors/:id":                   {owner: ownerVendor},
	"POST /v1/coupon-types":                 {admin: true, write: true},
	"GET /v1/coupon-types/:id":              {catalogue: true},
	"POST /v1/coupon-types/:id/coupons":     {actsAs: "user_id", write: true, claim: true},
	"GET /v1/coupons/:id":                   {owner: ownerCoupon},
	"POST /v1/coupons/:id/use":              {owner: ownerCoupon, actsAs: "user_id", write: true, claim: true},
	"GET /v1/courses/:id/enrollments":       {admin: true},
	"GET /v1/students/:id/enrollments":      {owner: ownerStudent},
	"GET /v1/users/:id/coupons":             {owner: ownerUser},
	"GET /v1/users/:id/notifications":       {owner: ownerUser},
	"POST /v1/users/:id/notifications/read": {owner: ownerUser, write: true},
	"POST /v1/notifications/:id/read":       {owner: ownerNotification, write: true},
}

// ownerRule is how the owner of one kind of resource is found and told.
type ownerRule struct {
	// role the owner's token must carry besides sub = owner ("" any).
	role string
	// lookup reads the owner from the database (store.ErrNotFound when
	// the ID names nothing).
	lookup func(ctx context.Context, db store.DB, id string) (string, error)
	// notFound and what make the 404 that a missing ID and a non-owner
	// both get.
	notFound, what string
	// who says who the owner is, for docs/security.md's table.
	who string
}

var ownerRules = map[string]ownerRule{
	ownerEnrollment: {lookup: store.EnrollmentOwner, notFound: "enrollment_not_found", what: "enrollment",
		who: "the enrollment's student"},
	ownerCoupon: {lookup: store.CouponOwner, notFound: string(workflows.RefusalCouponNotFound), what: "coupon",
		who: "the coupon's user"},
	ownerVendor: {role: RoleVendor, lookup: store.VendorOwner, notFound: "vendor_not_found", what: "vendor",
		who: "the vendor itself (role `vendor`, `sub` = the vendor's ID)"},
	ownerStudent: {lookup: pathIsOwner, notFound: "student_not_found", what: "student",
		who: "the student the path names"},
	ownerUser: {lookup: pathIsOwner, notFound: "user_not_found", what: "user",
		who: "the user the path names"},
	ownerNotification: {lookup: store.NotificationOwner, notFound: "notification_not_found", what: "notification",
		who: "the notification's recipient"},
}

// pathIsOwner: a list under /students/{id} or /users/{id} is that
// subject's own.
func pathIsOwner(_ context.Context, _ store.DB, id string) (string, error) { return id, nil }

// owns reports whether p may read or act on a resource of owner.
func (r ownerRule) owns(p Principal, owner string) bool {
	if p.Admin() {
		return true
	}
	return p.Subject != "" && p.Subject == owner && (r.role == "" || p.Role == r.role)
}

// notFoundAnswer is the 404 of a missing ID, which a non-owner gets too.
func (r ownerRule) notFoundAnswer(c *gin.Context, field string) {
	writeError(c, http.StatusNotFound, r.notFound, "no "+r.what+" with this id", field)
}

// ownerRuleOf is the owner rule routePolicies names for the request's
// route; ok is false (and the answer 500) when it names none, so a handler
// and the table cannot drift apart silently.
func (s *server) ownerRuleOf(c *gin.Context) (ownerRule, bool) {
	name := policyOf(c.Request.Method, c.FullPath()).owner
	rule, ok := ownerRules[name]
	if !ok {
		s.internalError(c, fmt.Errorf("%s %s checks an owner, but routePolicies names no owner rule for it (%q)",
			c.Request.Method, c.FullPath(), name))
	}
	return rule, ok
}

// authorizeOwner reads from the database who owns the resource id names,
// under the route's owner rule, before any run starts or signal is sent.
// The owner and admins get through (it returns the owner); anyone else is
// answered exactly as a missing ID, so IDs cannot be probed.
func (s *server) authorizeOwner(c *gin.Context, field, id string) (string, bool) {
	rule, ok := s.ownerRuleOf(c)
	if !ok {
		return "", false
	}
	owner, err := rule.lookup(c.Request.Context(), s.db, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.internalError(c, err)
		return "", false
	}
	if err != nil || !rule.owns(principalOf(c), owner) {
		rule.notFoundAnswer(c, field)
		return "", false
	}
	return owner, true
}

// loadOwned answers the common part of a GET of an owned resource: a
// valid ID, the owner check, then the read.
func loadOwned[T any](s *server, c *gin.Context, load func(context.Context, string) (T, error)) (T, bool) {
	var zero T
	id := c.Param("id")
	if !validID(c, "id", id) {
		return zero, false
	}
	if _, ok := s.authorizeOwner(c, "id", id); !ok {
		return zero, false
	}
	got, err := load(c.Request.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		if rule, ok := s.ownerRuleOf(c); ok {
			rule.notFoundAnswer(c, "id")
		}
		return zero, false
	}
	if err != nil {
		s.internalError(c, err)
		return zero, false
	}
	return got, true
}

// PolicyRoutes lists the routes of routePolicies ("METHOD /v1/pattern"),
// sorted, so a test outside this package (the real-stack authorization
// matrix) can insist on a row for each.
func PolicyRoutes() []string {
	return slices.Sorted(maps.Keys(routePolicies))
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
		limits: newLimits(s.cfg.Security),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_http_shed_total",
			Help: "Requests answered 429 by reason: rate_limited (per-subject rate limit), subject_inflight (one subject's claims in flight) or overloaded (claims in flight).",
		}, []string{"reason"}),
	}
	s.cfg.Metrics.MustRegister(g.shed)
	if s.cfg.Security.InsecureNoAuth {
		s.log.Warn("AUTHENTICATION IS OFF (--insecure-no-auth): every request acts as an admin; " +
			"never expose this server beyond a sandbox")
	}
	return func(c *gin.Context) {
		s.authenticate(c)
		if c.IsAborted() {
			return
		}
		p := principalOf(c)
		if !p.knownRole() {
			// Not a student by default: an identity provider's "Admin" or
			// "registrar" means something only JWT_ROLE_MAP can say.
			writeError(c, http.StatusForbidden, "forbidden", fmt.Sprintf("the token's role %q is not one of %s, %s, %s or none; "+
				"the operator may map it with JWT_ROLE_MAP", truncate(p.Role, 64), RoleAdmin, RoleVendor, RoleStudent), "")
			return
		}
		pol := policyOf(c.Request.Method, c.FullPath())
		if pol.admin && !p.Admin() {
			writeError(c, http.StatusForbidden, "forbidden", "this operation needs role "+RoleAdmin, "")
			return
		}
		if !g.rateLimit(c, p, pol.write) {
			return
		}
		if pol.claim {
			release, ok := g.acquireClaim(c, p)
			if !ok {
				return
			}
			defer release()
		}
		c.Next()
	}
}
