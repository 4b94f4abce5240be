package main

// Authentication, authorization and bad input against the real stack: the
// answers listed here are what the README's "Authentication and limits"
// promises.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// as is a copy of the client carrying a token of sub and role, signed with
// secret; an empty sub sends no token.
func (c *apiClient) as(secret, sub, role string) *apiClient {
	c.t.Helper()
	cp := *c
	cp.token = ""
	if sub != "" {
		var err error
		if cp.token, err = mintToken(secret, sub, role, time.Hour); err != nil {
			c.t.Fatal(err)
		}
	}
	return &cp
}

// raw sends a request with the body and headers as given.
func (c *apiClient) raw(method, path, contentType string, body []byte) (int, http.Header, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header, buf.String()
}

func TestAuthAgainstTheStack(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	t.Setenv("RATE_LIMIT_PER_SUBJECT", "5")
	t.Setenv("RATE_LIMIT_BURST", "10")
	s := testStack(t, dataDir(t))
	if s.Config.Security.JWTSecret == "" {
		t.Fatal("the stack has no JWT secret")
	}
	secret := s.Config.Security.JWTSecret
	admin := newAPIClient(t, s)
	anonymous := admin.as(secret, "", "")
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	course := "auth-" + run
	s1, s2 := "s1-"+run, "s2-"+run
	student1, student2 := admin.as(secret, s1, ""), admin.as(secret, s2, "")

	expect := func(c *apiClient, method, path string, body any, status int, code string) map[string]any {
		t.Helper()
		got, out, err := c.do(method, path, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		if got != status || (code != "" && errorCode(out) != code) {
			t.Fatalf("%s %s = %d %v, want %d %s", method, path, got, out, status, code)
		}
		return out
	}

	t.Run("no or bad token: 401 with WWW-Authenticate", func(t *testing.T) {
		for _, c := range []*apiClient{anonymous, {t: t, base: admin.base, http: admin.http, token: "not.a.jwt"}} {
			status, h, body := c.raw("POST", "/v1/courses", "application/json", []byte(`{"title":"x","capacity":1}`))
			if status != http.StatusUnauthorized || !strings.Contains(body, `"unauthenticated"`) || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("= %d %q (WWW-Authenticate %q)", status, body, h.Get("WWW-Authenticate"))
			}
		}
		for _, path := range []string{"/healthz", "/readyz", "/openapi.json", "/metrics"} {
			if status, _, body := anonymous.raw("GET", path, "", nil); status != http.StatusOK {
				t.Errorf("GET %s without a token = %d %s", path, status, body)
			}
		}
	})

	t.Run("admin-only operations", func(t *testing.T) {
		expect(student1, "POST", "/v1/courses", map[string]any{"id": course, "title": "Auth", "capacity": 5}, http.StatusForbidden, "forbidden")
		expect(admin, "POST", "/v1/courses", map[string]any{"id": course, "title": "Auth", "capacity": 5}, http.StatusCreated, "")
		expect(student1, "POST", "/v1/vendors", map[string]any{"name": "x"}, http.StatusForbidden, "forbidden")
		expect(student1, "POST", "/v1/coupon-types", map[string]any{"vendor_id": "v", "name": "x", "stock": 1, "payout_cents": 1}, http.StatusForbidden, "forbidden")
		expect(student1, "GET", "/v1/dead-letters", nil, http.StatusForbidden, "forbidden")
		expect(student1, "POST", "/v1/dead-letters/1/retry", nil, http.StatusForbidden, "forbidden")
		expect(admin, "GET", "/v1/dead-letters?limit=1", nil, http.StatusOK, "")
		// Catalogue reads are open to any authenticated subject.
		expect(student2, "GET", "/v1/courses/"+course, nil, http.StatusOK, "")
	})

	var enrollmentID string
	t.Run("students enroll and cancel only as themselves", func(t *testing.T) {
		expect(student1, "POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": s2}, http.StatusForbidden, "forbidden")
		e := expect(student1, "POST", "/v1/courses/"+course+"/enrollments?wait=confirmed", map[string]any{"student_id": s1}, http.StatusCreated, "")
		enrollmentID = e["id"].(string)
		// Someone else's enrollment is answered as a missing one.
		expect(student2, "DELETE", "/v1/enrollments/"+enrollmentID, nil, http.StatusNotFound, "enrollment_not_found")
		expect(student1, "DELETE", "/v1/enrollments/"+enrollmentID, nil, http.StatusOK, "")
		// An admin acts for anyone.
		e = expect(admin, "POST", "/v1/courses/"+course+"/enrollments?wait=confirmed", map[string]any{"student_id": s2}, http.StatusCreated, "")
		expect(admin, "DELETE", "/v1/enrollments/"+e["id"].(string), nil, http.StatusOK, "")
	})

	t.Run("students claim and use coupons only as themselves", func(t *testing.T) {
		vendor := "auth-v-" + run
		expect(admin, "POST", "/v1/vendors", map[string]any{"id": vendor, "name": "Auth vendor"}, http.StatusCreated, "")
		typeID := "auth-ct-" + run
		expect(admin, "POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendor, "name": "x", "stock": 5, "payout_cents": 100}, http.StatusCreated, "")
		expect(student1, "POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": s2}, http.StatusForbidden, "forbidden")
		k := expect(student1, "POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": s1}, http.StatusCreated, "")
		coupon := k["id"].(string)
		expect(student2, "POST", "/v1/coupons/"+coupon+"/use", map[string]any{"user_id": s1}, http.StatusForbidden, "forbidden")
		// s-2 as itself on s-1's coupon: answered as a missing coupon, before any run.
		expect(student2, "POST", "/v1/coupons/"+coupon+"/use", map[string]any{"user_id": s2}, http.StatusNotFound, "coupon_not_found")
		expect(student1, "POST", "/v1/coupons/"+coupon+"/use", map[string]any{"user_id": s1, "order_id": "o-" + run}, http.StatusOK, "")
	})

	t.Run("bad input: 4xx in the envelope", func(t *testing.T) {
		path := "/v1/courses/" + course + "/enrollments"
		for _, tc := range []struct {
			name, ctype string
			body        []byte
			status      int
			code        string
		}{
			{"unknown field", "application/json", []byte(`{"student_id":"x","admin":true}`), 400, `"unknown_field","message":"unknown field \"admin\"","field":"admin"`},
			{"bad id", "application/json", []byte(`{"student_id":"a:b"}`), 400, `"field":"student_id"`},
			{"trailing data", "application/json", []byte(`{"student_id":"x"}]`), 400, `"invalid_json"`},
			{"too large", "application/json", []byte(`{"student_id":"` + strings.Repeat("x", 70<<10) + `"}`), 413, `"body_too_large"`},
			{"form", "application/x-www-form-urlencoded", []byte(`student_id=x`), 415, `"unsupported_media_type"`},
		} {
			status, _, body := admin.raw("POST", path, tc.ctype, tc.body)
			if status != tc.status || !strings.Contains(body, tc.code) || !strings.HasPrefix(body, `{"error":{"code":`) {
				t.Errorf("%s = %d %s, want %d with %s", tc.name, status, body, tc.status, tc.code)
			}
		}
		if status, _, body := admin.raw("GET", "/v1/courses/"+strings.Repeat("c", 65), "", nil); status != 400 {
			t.Errorf("a 65-byte ID = %d %s", status, body)
		}
	})

	t.Run("per-subject write limit: 429 with Retry-After", func(t *testing.T) {
		student3 := admin.as(secret, "s3-"+run, "")
		limited := 0
		var retryAfter string
		for range 30 {
			// Invalid bodies: the limit applies before validation, and
			// nothing reaches Temporal.
			status, h, _ := student3.raw("POST", "/v1/courses/"+course+"/enrollments", "application/json", []byte(`{}`))
			if status == http.StatusTooManyRequests {
				limited++
				retryAfter = h.Get("Retry-After")
			}
		}
		if limited == 0 || retryAfter == "" {
			t.Fatalf("30 writes at once with burst 10: %d answered 429 (Retry-After %q)", limited, retryAfter)
		}
		// Another subject and the admin are not affected.
		expect(student2, "POST", "/v1/courses/"+course+"/enrollments", map[string]any{}, http.StatusBadRequest, "missing_field")
		for range 30 {
			expect(admin, "POST", "/v1/courses/"+course+"/enrollments", map[string]any{}, http.StatusBadRequest, "missing_field")
		}
	})

	t.Run("claimflow token mints what the API accepts", func(t *testing.T) {
		var out bytes.Buffer
		if err := runToken(context.Background(), s.Config, nil, []string{"--sub", "ops-" + run, "--role", "admin"}, &out); err != nil {
			t.Fatal(err)
		}
		c := &apiClient{t: t, base: admin.base, http: admin.http, token: strings.TrimSpace(out.String())}
		expect(c, "GET", "/v1/dead-letters?limit=1", nil, http.StatusOK, "")
	})
}
