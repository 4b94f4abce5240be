package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

	"github.com/claimflow/claimflow/internal/config"
)

// RoleAdmin is the value of the token's role claim that allows creating
// courses, vendors and coupon types, operating dead letters, and acting on
// behalf of any student or user. A student (RoleStudent, or no role) may
// only enroll, cancel and use coupons as its own subject; any role not
// built in nor mapped (JWTOptions.RoleMap) is refused with 403.
const RoleAdmin = "admin"

// RoleVendor marks a vendor's token: with sub = the vendor's ID it may read
// its own vendor record (balance and payouts). Otherwise it is a student.
const RoleVendor = "vendor"

// RoleStudent names a student explicitly; a token without a role is one
// too. JWT_ROLE_MAP maps an identity provider's roles onto these three.
const RoleStudent = "student"

// Principal is who a request acts as: the token's sub and role claims.
type Principal struct {
	Subject string
	Role    string
}

// Admin reports whether the principal has role admin.
func (p Principal) Admin() bool { return p.Role == RoleAdmin }

// knownRole reports whether the principal's role (mapped by RoleMap and
// with RoleStudent read as no role) is one the API gives rights to.
func (p Principal) knownRole() bool {
	return p.Role == "" || p.Role == RoleAdmin || p.Role == RoleVendor
}

// checkRoleMap refuses a map onto anything but the built-in roles.
func checkRoleMap(m map[string]string) error {
	for from, to := range m {
		switch to {
		case RoleAdmin, RoleVendor, RoleStudent:
		default:
			return fmt.Errorf("JWT_ROLE_MAP: %q maps to %q, not one of %s, %s, %s", from, to, RoleAdmin, RoleVendor, RoleStudent)
		}
	}
	return nil
}

// Authenticator verifies a bearer token and names its principal.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Principal, error)
}

// ErrKeysUnavailable wraps failures to obtain verification keys (the JWKS
// endpoint is down): the API answers 503, not 401, since the token may be
// fine.
var ErrKeysUnavailable = errors.New("verification keys unavailable")

// Security configures authentication, authorization and load limits.
// The zero value refuses every /v1 request with 401 (no Auth) and sets no
// limits; cmd/claimflow fills it from the environment.
type Security struct {
	// Auth verifies bearer tokens (NewHS256, NewJWKS).
	Auth Authenticator
	// InsecureNoAuth serves /v1 without tokens; every request acts as an
	// admin named "anonymous". Only for explicit opt-in (--insecure-no-auth).
	InsecureNoAuth bool
	// RatePerSubject is the sustained rate (requests per second) of write
	// requests (POST, DELETE) one non-admin subject may make, with RateBurst
	// on top; 0 means unlimited.
	RatePerSubject float64
	RateBurst      int
	// AdminRatePerSubject is the same for subjects with role admin (burst
	// twice the rate); 0 means admins are not limited.
	AdminRatePerSubject float64
	// ReadRatePerSubject and ReadBurst limit the reads (GET) of one
	// non-admin subject the same way; 0 means unlimited. Admins' reads are
	// not limited (operators list dead letters in bulk).
	ReadRatePerSubject float64
	ReadBurst          int
	// MaxConfirmWaiters bounds the ?wait=confirmed requests waiting for
	// their confirmation at once; beyond it a request answers 202 with the
	// current status at once. 0 means the default (1024).
	MaxConfirmWaiters int
	// MaxInflightClaims bounds the requests waiting on Temporal at once
	// (enroll, cancel, issue, use, dead-letter decisions); a request beyond
	// it is answered 429 at once instead of queueing. 0 means unbounded.
	MaxInflightClaims int
	// MaxInflightClaimsPerSubject bounds the claims one non-admin subject
	// has waiting on Temporal at once, so that no subject holds a large
	// share of MaxInflightClaims while Temporal is slow; beyond it 429.
	// Admins are not bounded (as RatePerSubject spares them). 0 means
	// unbounded.
	MaxInflightClaimsPerSubject int
}

// JWTOptions are checks common to both token kinds.
type JWTOptions struct {
	// Issuer and Audience, when set, must match the iss and aud claims.
	Issuer   string
	Audience string
	// RoleClaim names the claim holding the principal's role (default
	// "role"); a token whose role claim is not a string is refused.
	RoleClaim string
	// Leeway absorbs clock skew on exp, nbf and iat (default 30 s).
	Leeway time.Duration
	// MaxTTL is the longest lifetime (exp - iat) a token may have; a
	// token without iat or exp is refused too. 0 means
	// config.DefaultJWTMaxTTL.
	MaxTTL time.Duration
	// RoleMap renames roles of the token's role claim to the API's own
	// (RoleAdmin, RoleVendor, RoleStudent), e.g. registrar → admin. A
	// role neither built in nor mapped is refused with 403.
	RoleMap map[string]string
	// Now replaces the clock (tests).
	Now func() time.Time
}

// defaultRoleClaim is where a token carries its role unless
// JWTOptions.RoleClaim names another claim.
const defaultRoleClaim = "role"

// MinHS256SecretBytes is the shortest HS256 secret NewHS256 accepts
// (RFC 7518 §3.2: at least the hash's size).
const MinHS256SecretBytes = 32

// verifier checks a token's signature with keyfunc and its claims.
type verifier struct {
	parser    *jwt.Parser
	roleClaim string
	roleMap   map[string]string
	maxTTL    time.Duration
	keyfunc   func(ctx context.Context) jwt.Keyfunc
	jwks      *jwks // the key set cache of an RS256 verifier, for tests
}

// lifetimeError: the token lives longer (exp - iat) than MaxTTL allows.
type lifetimeError struct{ lifetime, max time.Duration }

func (e lifetimeError) Error() string {
	return fmt.Sprintf("token lifetime exceeds the longest accepted (exp - iat is %s, JWT_MAX_TTL %s)", e.lifetime, e.max)
}

func newVerifier(method string, o JWTOptions, keyfunc func(ctx context.Context) jwt.Keyfunc) *verifier {
	leeway := o.Leeway
	if leeway == 0 {
		leeway = 30 * time.Second
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{method}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
	}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		opts = append(opts, jwt.WithAudience(o.Audience))
	}
	if o.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(o.Now))
	}
	roleClaim := o.RoleClaim
	if roleClaim == "" {
		roleClaim = defaultRoleClaim
	}
	maxTTL := o.MaxTTL
	if maxTTL <= 0 {
		maxTTL = config.DefaultJWTMaxTTL
	}
	return &verifier{parser: jwt.NewParser(opts...), roleClaim: roleClaim, roleMap: maps.Clone(o.RoleMap),
		maxTTL: maxTTL, keyfunc: keyfunc}
}

func (v *verifier) Authenticate(ctx context.Context, raw string) (Principal, error) {
	// One JSON decode of the claims: MapClaims serves the parser's checks
	// (exp, iat, nbf, iss, aud) and the role claim alike.
	claims := jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(raw, claims, v.keyfunc(ctx)); err != nil {
		return Principal{}, err
	}
	sub, err := claims.GetSubject()
	if err != nil {
		return Principal{}, fmt.Errorf("%w: sub must be a string", jwt.ErrTokenMalformed)
	}
	if strings.TrimSpace(sub) == "" {
		return Principal{}, fmt.Errorf("%w: sub", jwt.ErrTokenRequiredClaimMissing)
	}
	if err := v.checkLifetime(claims); err != nil {
		return Principal{}, err
	}
	var role string
	if raw, ok := claims[v.roleClaim]; ok {
		if role, ok = raw.(string); !ok {
			return Principal{}, fmt.Errorf("%w: %s must be a string", jwt.ErrTokenMalformed, v.roleClaim)
		}
	}
	if to, ok := v.roleMap[role]; ok {
		role = to
	}
	if role == RoleStudent {
		role = ""
	}
	return Principal{Subject: sub, Role: role}, nil
}

// checkLifetime requires iat and exp (the parser has checked their types
// and the clock) and refuses a token that lives longer than maxTTL: a
// leaked token stays usable for that long at most.
func (v *verifier) checkLifetime(claims jwt.MapClaims) error {
	iat, err := claims.GetIssuedAt()
	if err != nil {
		return err
	}
	exp, err := claims.GetExpirationTime()
	if err != nil {
		return err
	}
	if iat == nil || exp == nil {
		return fmt.Errorf("%w: iat and exp", jwt.ErrTokenRequiredClaimMissing)
	}
	if lifetime := exp.Sub(iat.Time); lifetime > v.maxTTL {
		return lifetimeError{lifetime: lifetime, max: v.maxTTL}
	}
	return nil
}

// NewHS256 verifies HS256 tokens signed with secret (the local stack).
func NewHS256(secret []byte, o JWTOptions) (Authenticator, error) {
	if len(secret) < MinHS256SecretBytes {
		return nil, fmt.Errorf("HS256 secret must be at least %d bytes, got %d", MinHS256SecretBytes, len(secret))
	}
	if err := checkRoleMap(o.RoleMap); err != nil {
		return nil, err
	}
	key := append([]byte(nil), secret...)
	return newVerifier(jwt.SigningMethodHS256.Alg(), o, func(context.Context) jwt.Keyfunc {
		return func(*jwt.Token) (any, error) { return key, nil }
	}), nil
}

const principalKey = "claimflow.principal"

// maxTokenBytes bounds the Authorization header we try to parse.
const maxTokenBytes = 8 << 10

// authenticate puts the request's Principal on the context or answers 401
// (503 when the keys cannot be fetched).
func (s *server) authenticate(c *gin.Context) {
	if s.cfg.Security.InsecureNoAuth {
		c.Set(principalKey, Principal{Subject: "anonymous", Role: RoleAdmin})
		return
	}
	raw, ok := bearerToken(c.GetHeader("Authorization"))
	if !ok {
		c.Header("WWW-Authenticate", `Bearer realm="claimflow"`)
		writeError(c, http.StatusUnauthorized, "unauthenticated", "send Authorization: Bearer <JWT>", "")
		return
	}
	if s.cfg.Security.Auth == nil {
		c.Header("WWW-Authenticate", `Bearer realm="claimflow", error="invalid_token"`)
		writeError(c, http.StatusUnauthorized, "unauthenticated", "the server has no token verifier configured", "")
		return
	}
	p, err := s.cfg.Security.Auth.Authenticate(c.Request.Context(), raw)
	if errors.Is(err, ErrKeysUnavailable) {
		s.unavailable(c, err)
		return
	}
	if err != nil {
		msg := tokenProblem(err)
		c.Header("WWW-Authenticate", `Bearer realm="claimflow", error="invalid_token", error_description="`+msg+`"`)
		writeError(c, http.StatusUnauthorized, "unauthenticated", msg, "")
		return
	}
	c.Set(principalKey, p)
}

// bearerToken extracts the token of an "Authorization: Bearer <token>" header.
func bearerToken(h string) (string, bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(h), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	if token == "" || len(token) > maxTokenBytes {
		return "", false
	}
	return token, true
}

// tokenProblem says what was wrong with a token without echoing it. The
// text goes into a quoted header parameter, so it holds no quotes.
func tokenProblem(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token is expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "token is not valid yet"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "token signature is invalid or its signing method is not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "token issuer is not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "token audience is not accepted"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token lacks a required claim (sub, iat and exp are required)"
	case errors.As(err, new(lifetimeError)):
		return err.Error()
	case errors.Is(err, errUnknownKey):
		return "token is signed by an unknown key"
	case errors.Is(err, jwt.ErrTokenMalformed), errors.Is(err, jwt.ErrInvalidType):
		return "token is malformed"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token cannot be verified (signing method or key not accepted)"
	}
	return "token is invalid"
}

// principalOf is the request's principal (set by authenticate).
func principalOf(c *gin.Context) Principal {
	p, _ := c.Get(principalKey)
	pr, _ := p.(Principal)
	return pr
}

// mayActFor checks that the caller may act on behalf of owner, the student
// or user named by field: admins may act for anyone, a student only for
// itself. It answers 403 otherwise.
func (s *server) mayActFor(c *gin.Context, field, owner string) bool {
	if acts := policyOf(c.Request.Method, c.FullPath()).actsAs; acts != field {
		s.internalError(c, fmt.Errorf("%s %s checks that %s is the subject, but routePolicies says actsAs %q",
			c.Request.Method, c.FullPath(), field, acts))
		return false
	}
	p := principalOf(c)
	if p.Admin() || (p.Subject != "" && p.Subject == owner) {
		return true
	}
	writeError(c, http.StatusForbidden, "forbidden",
		fmt.Sprintf("%s must be the token's subject; only role %s may act for others", field, RoleAdmin), field)
	return false
}

// truncate shortens s to n bytes for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
