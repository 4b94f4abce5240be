package api

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/claimflow/claimflow/internal/config"
)

// reachedTemporal is how an enroll answers when it passed authentication,
// authorization and validation: the fake Temporal refuses with 404.
func reachedTemporal(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusNotFound || errorOf(t, rec).Code != "course_not_found" {
		t.Fatalf("want the fake Temporal's 404 course_not_found, got %d %s", rec.Code, rec.Body.String())
	}
}

func TestEveryV1RouteNeedsAToken(t *testing.T) {
	a := newTestAPI(t, Security{})
	n := 0
	for _, r := range a.engine(t).Routes() {
		if !strings.HasPrefix(r.Path, "/v1/") {
			continue
		}
		n++
		path := strings.ReplaceAll(r.Path, ":id", "1")
		for _, authz := range []string{"", "Bearer not-a-jwt", "Basic dXNlcjpwdw==", "Bearer " + signHS256(t, "another-secret-another-secret-another", jwt.MapClaims{"sub": "s-1", "role": "admin", "exp": time.Now().Add(time.Hour).Unix()})} {
			rec := a.serve(request{method: r.Method, path: path, contentType: "application/json", body: []byte(`{}`), authorization: authz})
			if rec.Code != http.StatusUnauthorized || errorOf(t, rec).Code != "unauthenticated" {
				t.Errorf("%s %s with Authorization %q = %d %s, want 401 unauthenticated", r.Method, path, authz, rec.Code, rec.Body.String())
				continue
			}
			if h := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(h, `Bearer realm="claimflow"`) {
				t.Errorf("%s %s: WWW-Authenticate = %q", r.Method, path, h)
			}
		}
	}
	if n < 16 {
		t.Fatalf("only %d /v1 routes found", n)
	}
	if a.temporal.Calls() != 0 {
		t.Fatalf("unauthenticated requests reached Temporal %d times", a.temporal.Calls())
	}
}

func TestPublicRoutesNeedNoToken(t *testing.T) {
	a := newTestAPI(t, Security{})
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		if rec := a.serve(request{method: http.MethodGet, path: path}); rec.Code != http.StatusOK {
			t.Errorf("GET %s = %d %s", path, rec.Code, rec.Body.String())
		}
	}
	rec := a.serve(request{method: http.MethodGet, path: "/openapi.json"})
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc["openapi"] == nil {
		t.Fatalf("/openapi.json is not an OpenAPI document: %v", err)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("/openapi.json Content-Type = %q", ct)
	}
}

func TestTokenChecks(t *testing.T) {
	now := time.Now()
	hs, err := NewHS256([]byte(testSecret), JWTOptions{Issuer: "https://idp.test", Audience: "claimflow"})
	if err != nil {
		t.Fatal(err)
	}
	a := newTestAPI(t, Security{Auth: hs})
	good := jwt.MapClaims{"sub": "admin-1", "role": "admin", "iss": "https://idp.test", "aud": "claimflow",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	with := func(k string, v any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for key, val := range good {
			c[key] = val
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	noneToken, err := jwt.NewWithClaims(jwt.SigningMethodNone, good).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	hs512, err := jwt.NewWithClaims(jwt.SigningMethodHS512, good).SignedString([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, authz, want string
	}{
		{"expired", "Bearer " + signHS256(t, testSecret, with("exp", now.Add(-time.Hour).Unix())), "token is expired"},
		{"not yet valid", "Bearer " + signHS256(t, testSecret, with("nbf", now.Add(time.Hour).Unix())), "token is not valid yet"},
		{"issued in the future", "Bearer " + signHS256(t, testSecret, with("iat", now.Add(time.Hour).Unix())), "token is not valid yet"},
		{"no exp", "Bearer " + signHS256(t, testSecret, with("exp", nil)), "token lacks a required claim"},
		{"no sub", "Bearer " + signHS256(t, testSecret, with("sub", nil)), "token lacks a required claim"},
		{"blank sub", "Bearer " + signHS256(t, testSecret, with("sub", " ")), "token lacks a required claim"},
		{"wrong issuer", "Bearer " + signHS256(t, testSecret, with("iss", "https://evil.test")), "token issuer is not accepted"},
		{"wrong audience", "Bearer " + signHS256(t, testSecret, with("aud", "someone-else")), "token audience is not accepted"},
		{"sub not a string", "Bearer " + signHS256(t, testSecret, with("sub", 42)), "token is malformed"},
		{"exp not a number", "Bearer " + signHS256(t, testSecret, with("exp", "tomorrow")), "token is malformed"},
		{"audience list without us", "Bearer " + signHS256(t, testSecret, with("aud", []string{"a", "b"})), "token audience is not accepted"},
		{"role not a string", "Bearer " + signHS256(t, testSecret, with("role", []string{"admin"})), "token is malformed"},
		{"wrong secret", "Bearer " + signHS256(t, "wrong-secret-wrong-secret-wrong-secret", good), "token signature is invalid"},
		{"alg none", "Bearer " + noneToken, "token signature is invalid"},
		{"alg HS512", "Bearer " + hs512, "token signature is invalid"},
		{"malformed", "Bearer a.b.c", "token is malformed"},
		{"missing", "", "send Authorization: Bearer"},
		{"basic scheme", "Basic YTpi", "send Authorization: Bearer"},
		{"bearer without token", "Bearer ", "send Authorization: Bearer"},
		{"oversized", "Bearer " + strings.Repeat("a", maxTokenBytes+1), "send Authorization: Bearer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := a.serve(request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: "application/json",
				body: []byte(`{"student_id":"s-1"}`), authorization: tc.authz})
			if rec.Code != http.StatusUnauthorized {
				t.Fatalf("= %d %s, want 401", rec.Code, rec.Body.String())
			}
			if e := errorOf(t, rec); e.Code != "unauthenticated" || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("error = %+v, want unauthenticated with %q", e, tc.want)
			}
			h := rec.Header().Get("WWW-Authenticate")
			sent := !strings.Contains(tc.want, "send Authorization")
			if sent != strings.Contains(h, `error="invalid_token"`) || !strings.HasPrefix(h, `Bearer realm="claimflow"`) {
				t.Fatalf("WWW-Authenticate = %q", h)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		rec := a.call(http.MethodPost, "/v1/courses/c1/enrollments", signHS256(t, testSecret, good), map[string]any{"student_id": "anyone"})
		reachedTemporal(t, rec)
	})
	t.Run("audience list with us", func(t *testing.T) {
		rec := a.call(http.MethodPost, "/v1/courses/c1/enrollments", signHS256(t, testSecret, with("aud", []string{"other", "claimflow"})), map[string]any{"student_id": "anyone"})
		reachedTemporal(t, rec)
	})
	t.Run("lowercase scheme", func(t *testing.T) {
		rec := a.serve(request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: "application/json",
			body: []byte(`{"student_id":"s-1"}`), authorization: "bearer " + signHS256(t, testSecret, good)})
		reachedTemporal(t, rec)
	})
	if a.temporal.Calls() != 3 {
		t.Fatalf("Temporal saw %d calls, want only the 3 valid ones", a.temporal.Calls())
	}
}

// TestTokenLifetimeIsBounded: a token must carry iat and exp, and live
// (exp - iat) no longer than JWTOptions.MaxTTL (JWT_MAX_TTL, 24 h unless
// set), whichever way it is signed; else 401 naming the problem.
func TestTokenLifetimeIsBounded(t *testing.T) {
	now := time.Now()
	keys := testRSAKeys(t)
	jwksSrv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	clock := newTestClock()
	for _, tc := range []struct {
		name     string
		maxTTL   time.Duration // 0: the default
		rs256    bool
		iat, exp any    // nil: the claim is left out
		want     string // "": accepted; else the 401's message contains it
	}{
		{"an hour", 0, false, now.Unix(), now.Add(time.Hour).Unix(), ""},
		{"exactly the default 24h", 0, false, now.Unix(), now.Add(24 * time.Hour).Unix(), ""},
		{"a second beyond the default", 0, false, now.Unix(), now.Add(24*time.Hour + time.Second).Unix(), "token lifetime exceeds"},
		{"ten years (--ttl 87600h)", 0, false, now.Unix(), now.Add(87600 * time.Hour).Unix(), "token lifetime exceeds"},
		{"issued long ago, expiring soon", 0, false, now.Add(-48 * time.Hour).Unix(), now.Add(time.Hour).Unix(), "token lifetime exceeds"},
		{"no iat", 0, false, nil, now.Add(time.Hour).Unix(), "token lacks a required claim"},
		{"no exp", 0, false, now.Unix(), nil, "token lacks a required claim"},
		{"iat not a number", 0, false, "yesterday", now.Add(time.Hour).Unix(), "token is malformed"},
		{"within a configured 2h", 2 * time.Hour, false, now.Unix(), now.Add(2 * time.Hour).Unix(), ""},
		{"beyond a configured 2h", 2 * time.Hour, false, now.Unix(), now.Add(3 * time.Hour).Unix(), "token lifetime exceeds"},
		{"RS256 within the default", 0, true, clock.now().Unix(), clock.now().Add(time.Hour).Unix(), ""},
		{"RS256 ten years", 0, true, clock.now().Unix(), clock.now().Add(87600 * time.Hour).Unix(), "token lifetime exceeds"},
		{"RS256 without iat", 0, true, nil, clock.now().Add(time.Hour).Unix(), "token lacks a required claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claims := jwt.MapClaims{"sub": "admin-1", "role": RoleAdmin}
			if tc.iat != nil {
				claims["iat"] = tc.iat
			}
			if tc.exp != nil {
				claims["exp"] = tc.exp
			}
			var auth Authenticator
			var raw string
			if tc.rs256 {
				auth = newTestJWKS(t, jwksSrv.URL, clock, JWKSOptions{JWTOptions: JWTOptions{MaxTTL: tc.maxTTL}})
				claims["iss"], claims["aud"] = "https://idp.test", "claimflow"
				raw = signRS256(t, keys[0], "k1", claims)
			} else {
				var err error
				if auth, err = NewHS256([]byte(testSecret), JWTOptions{MaxTTL: tc.maxTTL}); err != nil {
					t.Fatal(err)
				}
				raw = signHS256(t, testSecret, claims)
			}
			a := newTestAPI(t, Security{Auth: auth})
			rec := a.call(http.MethodPost, "/v1/courses/c1/enrollments", raw, map[string]any{"student_id": "s-1"})
			if tc.want == "" {
				reachedTemporal(t, rec)
				return
			}
			if rec.Code != http.StatusUnauthorized {
				t.Fatalf("= %d %s, want 401", rec.Code, rec.Body.String())
			}
			if e := errorOf(t, rec); e.Code != "unauthenticated" || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("error = %+v, want unauthenticated with %q", e, tc.want)
			}
			if h := rec.Header().Get("WWW-Authenticate"); !strings.Contains(h, tc.want) {
				t.Fatalf("WWW-Authenticate = %q, want the reason %q", h, tc.want)
			}
		})
	}
}

// TestUnknownRolesAreRefused: a role that is neither built in (admin,
// vendor, student, none) nor mapped by JWTOptions.RoleMap (JWT_ROLE_MAP)
// is refused with 403 on every route, instead of passing as a student; a
// mapped role acts as its target.
func TestUnknownRolesAreRefused(t *testing.T) {
	roleMap := map[string]string{"registrar": RoleAdmin, "Admin": RoleAdmin, "user": RoleStudent, "shop": RoleVendor}
	enrollAs := func(student string) (string, string, map[string]any) {
		return http.MethodPost, "/v1/courses/c1/enrollments", map[string]any{"student_id": student}
	}
	listDeadLetters := func(string) (string, string, map[string]any) {
		return http.MethodGet, "/v1/dead-letters?limit=x", nil
	}
	readCourse := func(string) (string, string, map[string]any) { return http.MethodGet, "/v1/courses/c1", nil }
	const (
		reached   = "reached Temporal"
		forbidden = "403 forbidden"
		pastAdmin = "400 on limit: past the admin check"
	)
	for _, tc := range []struct {
		name    string
		roleMap map[string]string
		role    string
		req     func(sub string) (string, string, map[string]any)
		want    string
	}{
		{"no role: a student, as itself", nil, "", enrollAs, reached},
		{"student: as itself", nil, RoleStudent, enrollAs, reached},
		{"vendor: as itself", nil, RoleVendor, enrollAs, reached},
		{"admin", nil, RoleAdmin, listDeadLetters, pastAdmin},
		{"Admin, not mapped", nil, "Admin", enrollAs, forbidden},
		{"registrar, not mapped", nil, "registrar", enrollAs, forbidden},
		{"operator, not mapped: not even a catalogue read", nil, "operator", readCourse, forbidden},
		{"ADMIN, not in the map", roleMap, "ADMIN", enrollAs, forbidden},
		{"registrar mapped to admin", roleMap, "registrar", listDeadLetters, pastAdmin},
		{"Admin mapped to admin: acts for others", roleMap, "Admin", func(string) (string, string, map[string]any) { return enrollAs("s-2") }, reached},
		{"user mapped to student: as itself", roleMap, "user", enrollAs, reached},
		{"user mapped to student: not an admin", roleMap, "user", listDeadLetters, forbidden},
		{"shop mapped to vendor: as itself", roleMap, "shop", enrollAs, reached},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auth, err := NewHS256([]byte(testSecret), JWTOptions{RoleMap: tc.roleMap})
			if err != nil {
				t.Fatal(err)
			}
			a := newTestAPI(t, Security{Auth: auth})
			method, path, body := tc.req("u-1")
			rec := a.call(method, path, token(t, "u-1", tc.role, time.Hour), body)
			switch tc.want {
			case reached:
				reachedTemporal(t, rec)
			case pastAdmin:
				if rec.Code != http.StatusBadRequest || errorOf(t, rec).Field != "limit" {
					t.Fatalf("= %d %s, want 400 on limit", rec.Code, rec.Body.String())
				}
			case forbidden:
				if rec.Code != http.StatusForbidden || errorOf(t, rec).Code != "forbidden" {
					t.Fatalf("= %d %s, want 403 forbidden", rec.Code, rec.Body.String())
				}
				if a.temporal.Calls() != 0 {
					t.Fatal("a refused role reached Temporal")
				}
			}
		})
	}
	if _, err := NewHS256([]byte(testSecret), JWTOptions{RoleMap: map[string]string{"registrar": "root"}}); err == nil {
		t.Fatal("a role map onto an unknown role was accepted")
	}
	// JWT_ROLE_MAP's targets, as internal/config checks them, are this
	// package's roles.
	for _, role := range config.TokenRoles {
		auth, err := NewHS256([]byte(testSecret), JWTOptions{RoleMap: map[string]string{"idp-role": role}})
		if err != nil {
			t.Fatalf("config.TokenRoles has %q, which the API refuses as a target: %v", role, err)
		}
		p, err := auth.Authenticate(context.Background(), token(t, "u-1", "idp-role", time.Hour))
		if err != nil || !p.knownRole() {
			t.Fatalf("idp-role mapped to %q: %+v %v, want a known role", role, p, err)
		}
	}
}

func TestHS256SecretLength(t *testing.T) {
	if _, err := NewHS256([]byte("short"), JWTOptions{}); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
}

func TestNoVerifierRefusesEverything(t *testing.T) {
	h := New(Config{Temporal: &fakeTemporal{}, DB: unreachablePool(t)})
	defer h.Close()
	a := &testAPI{Handler: h}
	rec := a.call(http.MethodPost, "/v1/courses/c1/enrollments", token(t, "admin-1", RoleAdmin, time.Hour), map[string]any{"student_id": "s-1"})
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("zero Security = %d %s, want 401", rec.Code, rec.Body.String())
	}
}

func TestAdminOnlyRoutes(t *testing.T) {
	a := newTestAPI(t, Security{})
	student := token(t, "s-1", "", time.Hour)
	other := token(t, "s-1", RoleStudent, time.Hour) // as no role; unknown roles: TestUnknownRolesAreRefused
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	for key, p := range routePolicies {
		method, route, _ := strings.Cut(key, " ")
		path := strings.ReplaceAll(route, ":id", "1")
		for _, tok := range []string{student, other} {
			rec := a.call(method, path, tok, map[string]any{})
			forbidden := rec.Code == http.StatusForbidden && errorOf(t, rec).Code == "forbidden" && errorOf(t, rec).Field == ""
			if p.admin != forbidden {
				t.Errorf("student %s = %d %s; admin-only: %v", key, rec.Code, rec.Body.String(), p.admin)
			}
		}
		if rec := a.call(method, path, admin, map[string]any{}); rec.Code == http.StatusForbidden {
			t.Errorf("admin %s = 403 %s", key, rec.Body.String())
		}
	}
}

func TestStudentsActOnlyAsThemselves(t *testing.T) {
	a := newTestAPI(t, Security{})
	s1 := token(t, "s-1", "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)

	forbidden := func(rec *httptest.ResponseRecorder, field string) {
		t.Helper()
		if rec.Code != http.StatusForbidden {
			t.Fatalf("= %d %s, want 403", rec.Code, rec.Body.String())
		}
		if e := errorOf(t, rec); e.Code != "forbidden" || e.Field != field {
			t.Fatalf("error = %+v, want forbidden on %s", e, field)
		}
	}
	calls := a.temporal.Calls()
	forbidden(a.call(http.MethodPost, "/v1/courses/c1/enrollments", s1, map[string]any{"student_id": "s-2"}), "student_id")
	forbidden(a.call(http.MethodPost, "/v1/coupon-types/t1/coupons", s1, map[string]any{"user_id": "s-2"}), "user_id")
	forbidden(a.call(http.MethodPost, "/v1/coupons/k1/use", s1, map[string]any{"user_id": "s-2"}), "user_id")
	if a.temporal.Calls() != calls {
		t.Fatal("a forbidden claim reached Temporal")
	}
	// A body that the strict decoder would accept after a trailing "]" must
	// not slip past the check either: it is refused as invalid first.
	rec := a.serve(request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: "application/json",
		body: []byte(`{"student_id":"s-2"}]`), authorization: "Bearer " + s1})
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("trailing ] = %d %s, want 400", rec.Code, rec.Body.String())
	}

	reachedTemporal(t, a.call(http.MethodPost, "/v1/courses/c1/enrollments", s1, map[string]any{"student_id": "s-1"}))
	reachedTemporal(t, a.call(http.MethodPost, "/v1/courses/c1/enrollments", admin, map[string]any{"student_id": "s-2"}))
	// Issue as oneself: past the check the handler asks the (absent)
	// database, then the run, which the fake refuses.
	if rec := a.call(http.MethodPost, "/v1/coupon-types/t1/coupons", s1, map[string]any{"user_id": "s-1"}); rec.Code != http.StatusNotFound {
		t.Fatalf("issue as oneself = %d %s", rec.Code, rec.Body.String())
	}
	if rec := a.call(http.MethodPost, "/v1/coupon-types/t1/coupons", admin, map[string]any{"user_id": "s-2"}); rec.Code != http.StatusNotFound {
		t.Fatalf("admin issuing for s-2 = %d %s", rec.Code, rec.Body.String())
	}
	// Use as oneself gets past the check to the coupon lookup.
	if rec := a.call(http.MethodPost, "/v1/coupons/k1/use", s1, map[string]any{"user_id": "s-1"}); rec.Code != http.StatusInternalServerError ||
		!strings.Contains(a.logs.take(), errNoDatabase.Error()) {
		t.Fatalf("use as oneself = %d %s, want to reach the database", rec.Code, rec.Body.String())
	}
}

func TestRateLimitPerSubject(t *testing.T) {
	a := newTestAPI(t, Security{RatePerSubject: 0.001, RateBurst: 2})
	s1, s2 := token(t, "s-1", "", time.Hour), token(t, "s-2", "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	enroll := func(tok, student string) *httptest.ResponseRecorder {
		return a.call(http.MethodPost, "/v1/courses/c1/enrollments", tok, map[string]any{"student_id": student})
	}
	reachedTemporal(t, enroll(s1, "s-1"))
	reachedTemporal(t, enroll(s1, "s-1"))
	rec := enroll(s1, "s-1")
	if rec.Code != http.StatusTooManyRequests || errorOf(t, rec).Code != "rate_limited" {
		t.Fatalf("third write in the burst = %d %s, want 429 rate_limited", rec.Code, rec.Body.String())
	}
	if ra := rec.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("Retry-After = %q", ra)
	}
	// Reads are not limited, other subjects have their own bucket, admins
	// are not limited by default.
	if rec := a.call(http.MethodGet, "/v1/courses/c1", s1, nil); rec.Code == http.StatusTooManyRequests {
		t.Fatal("a GET was rate-limited")
	}
	reachedTemporal(t, enroll(s2, "s-2"))
	for range 20 {
		reachedTemporal(t, enroll(admin, "s-9"))
	}

	b := newTestAPI(t, Security{AdminRatePerSubject: 1})
	for range 2 {
		reachedTemporal(t, b.call(http.MethodPost, "/v1/courses/c1/enrollments", admin, map[string]any{"student_id": "s-1"}))
	}
	if rec := b.call(http.MethodPost, "/v1/courses/c1/enrollments", admin, map[string]any{"student_id": "s-1"}); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("admin beyond RATE_LIMIT_ADMIN's burst = %d, want 429", rec.Code)
	}
}

func TestSubjectLimiterForgetsIdleSubjects(t *testing.T) {
	l := newSubjectLimiter(10, 5)
	now := time.Now()
	for i := range 100 {
		l.take(string(rune('a'+i%26))+strings.Repeat("x", i), now)
	}
	if len(l.buckets) != 100 {
		t.Fatalf("%d buckets", len(l.buckets))
	}
	l.take("late", now.Add(2*time.Minute))
	if len(l.buckets) != 1 {
		t.Fatalf("%d buckets after the idle ones refilled, want 1", len(l.buckets))
	}
	if ok, wait := l.take("late", now.Add(2*time.Minute)); !ok || wait != 0 {
		t.Fatal("a fresh bucket refused its second token")
	}
}

func TestInflightClaimsShedAtOnce(t *testing.T) {
	a := newTestAPI(t, Security{MaxInflightClaims: 1})
	a.temporal.block = make(chan struct{})
	a.temporal.entered = make(chan struct{}, 10)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	var wg sync.WaitGroup
	var first *httptest.ResponseRecorder
	wg.Go(func() {
		first = a.call(http.MethodPost, "/v1/courses/c1/enrollments", admin, map[string]any{"student_id": "s-1"})
	})
	<-a.temporal.entered
	began := time.Now()
	rec := a.call(http.MethodPost, "/v1/coupon-types/t1/coupons", admin, map[string]any{"user_id": "s-2"})
	if rec.Code != http.StatusTooManyRequests || errorOf(t, rec).Code != "overloaded" || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("second claim while one is in flight = %d %s (Retry-After %q), want 429 overloaded",
			rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"))
	}
	if waited := time.Since(began); waited > time.Second {
		t.Fatalf("the shed request waited %s", waited)
	}
	// Reads do not take a slot.
	if rec := a.call(http.MethodGet, "/v1/dead-letters?limit=x", admin, nil); rec.Code != http.StatusBadRequest {
		t.Fatalf("a read while full = %d", rec.Code)
	}
	close(a.temporal.block)
	wg.Wait()
	reachedTemporal(t, first)
	reachedTemporal(t, a.call(http.MethodPost, "/v1/courses/c1/enrollments", admin, map[string]any{"student_id": "s-1"}))
}

// TestInflightClaimsPerSubject: one non-admin subject holds at most
// MaxInflightClaimsPerSubject claims waiting on Temporal; beyond that its
// claims are shed with 429 at once, without taking a server-wide slot,
// while other subjects and admins go on. The fake Temporal holds every
// claim that reaches it until the test lets them go, so each row is told
// apart by whether its request reached Temporal or was answered first.
func TestInflightClaimsPerSubject(t *testing.T) {
	a := newTestAPI(t, Security{MaxInflightClaims: 6, MaxInflightClaimsPerSubject: 2})
	a.temporal.block = make(chan struct{})
	a.temporal.entered = make(chan struct{}, 32)
	s1, s2 := token(t, "s-1", "", time.Hour), token(t, "s-2", "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	issue := func(typeID, user string) (string, string, map[string]any) {
		return http.MethodPost, "/v1/coupon-types/" + typeID + "/coupons", map[string]any{"user_id": user}
	}
	var held sync.WaitGroup
	defer held.Wait()
	released := false
	release := func() {
		if !released {
			released = true
			close(a.temporal.block)
		}
	}
	defer release()
	for _, tc := range []struct {
		name   string
		bearer string
		req    func() (string, string, map[string]any)
		// shed is the code of the 429 the request must get at once; ""
		// means it must reach Temporal (and stay there until released).
		shed string
	}{
		{"s-1's first claim", s1, func() (string, string, map[string]any) { return issue("t1", "s-1") }, ""},
		{"s-1's second claim", s1, func() (string, string, map[string]any) { return issue("t2", "s-1") }, ""},
		{"s-1's third claim", s1, func() (string, string, map[string]any) {
			return http.MethodPost, "/v1/courses/c1/enrollments", map[string]any{"student_id": "s-1"}
		}, "too_many_in_flight"},
		{"s-1's use of a coupon", s1, func() (string, string, map[string]any) {
			return http.MethodPost, "/v1/coupons/k1/use", map[string]any{"user_id": "s-1"}
		}, "too_many_in_flight"},
		{"another subject's claim", s2, func() (string, string, map[string]any) { return issue("t1", "s-2") }, ""},
		{"an admin's first claim", admin, func() (string, string, map[string]any) { return issue("t1", "s-3") }, ""},
		{"an admin's second claim", admin, func() (string, string, map[string]any) { return issue("t2", "s-3") }, ""},
		// Six in flight: the two claims shed above took no slot.
		{"an admin's third claim: admins are not bounded per subject", admin, func() (string, string, map[string]any) { return issue("t3", "s-3") }, ""},
		{"a seventh claim: the server-wide bound", s2, func() (string, string, map[string]any) { return issue("t2", "s-2") }, "overloaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, path, body := tc.req()
			answered := make(chan *httptest.ResponseRecorder, 1)
			held.Go(func() { answered <- a.call(method, path, tc.bearer, body) })
			select {
			case <-a.temporal.entered:
				if tc.shed != "" {
					t.Fatalf("%s %s reached Temporal, want 429 %s at once", method, path, tc.shed)
				}
			case rec := <-answered:
				if tc.shed == "" {
					t.Fatalf("%s %s = %d %s, want it to reach Temporal", method, path, rec.Code, rec.Body.String())
				}
				if rec.Code != http.StatusTooManyRequests || errorOf(t, rec).Code != tc.shed || rec.Header().Get("Retry-After") != "1" {
					t.Fatalf("%s %s = %d %s (Retry-After %q), want 429 %s with Retry-After 1",
						method, path, rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"), tc.shed)
				}
			}
		})
	}
	// Reads take no slot.
	if rec := a.call(http.MethodGet, "/v1/courses/c1", s1, nil); rec.Code == http.StatusTooManyRequests {
		t.Fatalf("s-1's read while it holds its claims = 429 %s", rec.Body.String())
	}
	release()
	held.Wait()
	// Decided, the claims give their slots back.
	if rec := a.call(http.MethodPost, "/v1/coupon-types/t9/coupons", s1, map[string]any{"user_id": "s-1"}); rec.Code != http.StatusNotFound {
		t.Fatalf("s-1's claim after its claims were decided = %d %s, want the fake's 404", rec.Code, rec.Body.String())
	}
}

func TestInsecureNoAuth(t *testing.T) {
	a := newTestAPI(t, Security{InsecureNoAuth: true})
	reachedTemporal(t, a.call(http.MethodPost, "/v1/courses/c1/enrollments", "", map[string]any{"student_id": "s-1"}))
	if logs := a.logs.take(); !strings.Contains(logs, "AUTHENTICATION IS OFF") {
		t.Fatalf("no loud warning in the log: %q", logs)
	}
}

func TestStrictDecoding(t *testing.T) {
	a := newTestAPI(t, Security{})
	admin := "Bearer " + token(t, "admin-1", RoleAdmin, time.Hour)
	big := append([]byte(`{"student_id":"s-1"}`), []byte(strings.Repeat(" ", maxBodyBytes))...)
	for _, tc := range []struct {
		name, ctype string
		body        []byte
		status      int
		code, field string
	}{
		{"unknown field", "application/json", []byte(`{"student_id":"s-1","role":"admin"}`), 400, "unknown_field", "role"},
		{"wrong type", "application/json", []byte(`{"student_id":7}`), 400, "invalid_field", "student_id"},
		{"array", "application/json", []byte(`[]`), 400, "invalid_json", ""},
		{"trailing object", "application/json", []byte(`{"student_id":"s-1"}{}`), 400, "invalid_json", ""},
		{"trailing bracket", "application/json", []byte(`{"student_id":"s-1"}]`), 400, "invalid_json", ""},
		{"trailing brace", "application/json", []byte(`{"student_id":"s-1"}}`), 400, "invalid_json", ""},
		{"empty", "application/json", nil, 400, "invalid_json", ""},
		{"syntax", "application/json", []byte(`{"student_id":`), 400, "invalid_json", ""},
		{"bad id", "application/json", []byte(`{"student_id":"../etc"}`), 400, "invalid_field", "student_id"},
		{"long id", "application/json", []byte(`{"student_id":"` + strings.Repeat("a", 65) + `"}`), 400, "invalid_field", "student_id"},
		{"missing id", "application/json", []byte(`{}`), 400, "missing_field", "student_id"},
		{"too large", "application/json", []byte(`{"student_id":"` + strings.Repeat("a", maxBodyBytes) + `"}`), 413, "body_too_large", ""},
		{"too large after the object", "application/json", big, 413, "body_too_large", ""},
		{"form", "application/x-www-form-urlencoded", []byte(`student_id=s-1`), 415, "unsupported_media_type", ""},
		{"text", "text/plain", []byte(`{"student_id":"s-1"}`), 415, "unsupported_media_type", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := a.serve(request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: tc.ctype, body: tc.body, authorization: admin})
			if rec.Code != tc.status {
				t.Fatalf("= %d %s, want %d", rec.Code, rec.Body.String(), tc.status)
			}
			if e := errorOf(t, rec); e.Code != tc.code || e.Field != tc.field {
				t.Fatalf("error = %+v, want %s on %q", e, tc.code, tc.field)
			}
		})
	}
	rec := a.serve(request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: "application/json; charset=utf-8",
		body: []byte(`{"student_id":"s-1"}`), authorization: admin})
	reachedTemporal(t, rec)
}

// ---- JWKS ----

type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	doc     []byte
	status  int
	fetches atomic.Int32
}

func newJWKSServer(t *testing.T) *jwksServer {
	s := &jwksServer{status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		w.WriteHeader(s.status)
		_, _ = w.Write(s.doc)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) publish(status int, keys map[string]*rsa.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
	s.doc = jwksDoc(keys)
}

func jwksDoc(keys map[string]*rsa.PublicKey) []byte {
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	set.Keys = append(set.Keys, map[string]string{"kty": "EC", "kid": "ec", "crv": "P-256", "x": "AA", "y": "AA"})
	for kid, k := range keys {
		set.Keys = append(set.Keys, map[string]string{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
			"n": base64.RawURLEncoding.EncodeToString(k.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.E)).Bytes())})
	}
	b, _ := json.Marshal(set)
	return b
}

var (
	rsaKeysOnce sync.Once
	rsaKeys     [2]*rsa.PrivateKey
)

func testRSAKeys(testing.TB) [2]*rsa.PrivateKey {
	rsaKeysOnce.Do(func() {
		for i := range rsaKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			rsaKeys[i] = k
		}
	})
	return rsaKeys
}

func signRS256(t *testing.T, key *rsa.PrivateKey, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWKS(t *testing.T) {
	keys := testRSAKeys(t)
	srv := newJWKSServer(t)
	srv.publish(http.StatusOK, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	var clock atomic.Int64
	clock.Store(time.Now().Unix())
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	auth, err := NewJWKS(srv.URL, JWKSOptions{JWTOptions: JWTOptions{Now: now}, TTL: time.Hour, MinRefresh: time.Minute, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	a := newTestAPI(t, Security{Auth: auth})
	claims := func() jwt.MapClaims {
		return jwt.MapClaims{"sub": "admin-1", "role": "admin", "iat": now().Unix(), "exp": now().Add(time.Hour).Unix()}
	}
	enroll := func(tok string) *httptest.ResponseRecorder {
		return a.call(http.MethodPost, "/v1/courses/c1/enrollments", tok, map[string]any{"student_id": "s-1"})
	}

	reachedTemporal(t, enroll(signRS256(t, keys[0], "k1", claims())))
	reachedTemporal(t, enroll(signRS256(t, keys[0], "k1", claims())))
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for two tokens, want 1 (cached)", n)
	}
	t.Run("alg confusion", func(t *testing.T) {
		// An HS256 token "signed" with the public key's bytes.
		forged := signHS256(t, string(jwksDoc(map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})), claims())
		if rec := enroll(forged); rec.Code != http.StatusUnauthorized {
			t.Fatalf("= %d", rec.Code)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		rec := enroll(signRS256(t, keys[1], "k2", claims()))
		if rec.Code != http.StatusUnauthorized || !strings.Contains(errorOf(t, rec).Message, "unknown key") {
			t.Fatalf("= %d %s", rec.Code, rec.Body.String())
		}
		// Within MinRefresh another unknown kid does not fetch again.
		before := srv.fetches.Load()
		enroll(signRS256(t, keys[1], "k3", claims()))
		if srv.fetches.Load() != before {
			t.Fatal("an unknown kid fetched the key set again within MinRefresh")
		}
	})
	t.Run("rotation", func(t *testing.T) {
		srv.publish(http.StatusOK, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey, "k2": &keys[1].PublicKey})
		clock.Add(61)
		reachedTemporal(t, enroll(signRS256(t, keys[1], "k2", claims())))
	})
	t.Run("wrong key for kid", func(t *testing.T) {
		if rec := enroll(signRS256(t, keys[1], "k1", claims())); rec.Code != http.StatusUnauthorized {
			t.Fatalf("= %d", rec.Code)
		}
	})
	t.Run("endpoint down", func(t *testing.T) {
		srv.publish(http.StatusInternalServerError, nil)
		clock.Add(2 * 3600) // the cache is stale
		// Known keys stay usable while the endpoint fails.
		reachedTemporal(t, enroll(signRS256(t, keys[0], "k1", claims())))
		// An unknown kid cannot be checked: 503, not 401.
		clock.Add(61)
		rec := enroll(signRS256(t, keys[0], "k9", claims()))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("= %d %s", rec.Code, rec.Body.String())
		}
	})
}

func TestParseJWKSRejectsWeakKeys(t *testing.T) {
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseJWKS(jwksDoc(map[string]*rsa.PublicKey{"weak": &weak.PublicKey})); err == nil {
		t.Fatal("a 1024-bit key was accepted")
	}
	if _, err := parseJWKS([]byte(`{"keys":[]}`)); err == nil {
		t.Fatal("an empty key set was accepted")
	}
	k := testRSAKeys(t)[0]
	even := &rsa.PublicKey{N: k.N, E: 65536}
	if _, err := parseJWKS(jwksDoc(map[string]*rsa.PublicKey{"even": even})); err == nil {
		t.Fatal("an even exponent was accepted")
	}
}

func TestJWKSURLMustBeHTTP(t *testing.T) {
	if _, err := NewJWKS("file:///etc/passwd", JWKSOptions{}); err == nil {
		t.Fatal("a file URL was accepted")
	}
}

func TestTokenProblemsAreHeaderSafe(t *testing.T) {
	for _, err := range []error{jwt.ErrTokenExpired, jwt.ErrTokenMalformed, errUnknownKey, errors.New("x")} {
		if msg := tokenProblem(err); strings.ContainsAny(msg, "\"\\\r\n") {
			t.Errorf("%q is not safe in a quoted header parameter", msg)
		}
	}
}

// BenchmarkAuthenticate is one HS256 token's verification, the work every
// /v1 request does before its handler.
func BenchmarkAuthenticate(b *testing.B) {
	hs, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "admin-1", "role": "admin",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}).SignedString([]byte(testSecret))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if p, err := hs.Authenticate(context.Background(), tok); err != nil || p.Role != RoleAdmin {
			b.Fatal(p, err)
		}
	}
}
