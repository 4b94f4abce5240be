package api

// Fuzz targets for every handler's request decoding. Each runs the real
// router (authentication, policy, limits, strict decoding, validation, the
// handler) over the test doubles of helpers_test.go and asserts
// checkAnswer: no panic, no 5xx except "the test has no database" once an
// input passed validation, every error in the standard envelope.
//
// `go test ./api/` replays the seeds below and the corpus in
// testdata/fuzz/<FuzzName>/; `go test -fuzz=FuzzEnroll ./api/` explores.

import (
	"crypto/rsa"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

var (
	fuzzOnce   sync.Once
	fuzzTokens struct{ admin, student string }
)

// fuzzAPI is one API per fuzz target (building one per input would dominate
// the run); as a student the requests carry sub s-1.
func fuzzAPI(f *testing.F) (*testAPI, func(asStudent bool) string) {
	fuzzOnce.Do(func() {
		fuzzTokens.admin = "Bearer " + token(f, "admin-1", RoleAdmin, 24*time.Hour)
		fuzzTokens.student = "Bearer " + token(f, "s-1", "", 24*time.Hour)
	})
	a := newTestAPI(f, Security{})
	return a, func(asStudent bool) string {
		if asStudent {
			return fuzzTokens.student
		}
		return fuzzTokens.admin
	}
}

func fuzzServe(t *testing.T, a *testAPI, r request) {
	a.logs.take()
	a.checkAnswer(t, r, a.serve(r))
}

const jsonType = "application/json"

func FuzzCreateCourse(f *testing.F) {
	f.Add(jsonType, []byte(`{"id":"cs101","title":"Intro","capacity":20,"credits":5}`))
	f.Add(jsonType, []byte(`{"title":"x","capacity":-1}`))
	f.Add(jsonType, []byte(`{"title":"x","capacity":1e309}`))
	f.Add(jsonType, []byte(`{"title":"x","capacity":20,"extra":true}`))
	f.Add("text/plain", []byte(`{}`))
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/courses", contentType: ctype, body: body, authorization: auth(false)})
	})
}

func FuzzEnroll(f *testing.F) {
	f.Add("cs101", "", jsonType, []byte(`{"student_id":"s-1"}`), true)
	f.Add("cs101", "wait=confirmed", jsonType, []byte(`{"student_id":"s-2"}`), false)
	f.Add("cs101", "wait=never", jsonType, []byte(`{"student_id":"s-1"}`), true)
	f.Add("cs:101", "", jsonType, []byte(`{"student_id":"s-1"}]`), true)
	f.Add("cs101", "", jsonType, []byte(`{"student_id":"s-2","Student_ID":"s-1"}`), true)
	f.Add("cs101", "", jsonType, []byte(`{"student_id":"s-1"}`+"\xff"), true)
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, courseID, query, ctype string, body []byte, asStudent bool) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/courses/" + courseID + "/enrollments", query: query,
			contentType: ctype, body: body, authorization: auth(asStudent)})
	})
}

func FuzzCancelEnrollment(f *testing.F) {
	f.Add("0190a2b3-c4d5-7e6f-8091-a2b3c4d5e6f7", false)
	f.Add("../../etc", true)
	f.Add("", true)
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, id string, asStudent bool) {
		fuzzServe(t, a, request{method: http.MethodDelete, path: "/v1/enrollments/" + id, authorization: auth(asStudent)})
	})
}

// getRoutes are the GETs by ID.
var getRoutes = []string{"/v1/courses/", "/v1/enrollments/", "/v1/vendors/", "/v1/coupon-types/", "/v1/coupons/", "/v1/dead-letters/"}

func FuzzGetByID(f *testing.F) {
	for i := range getRoutes {
		f.Add(uint8(i), "abc-1", false)
		f.Add(uint8(i), "%00", true)
	}
	f.Add(uint8(5), "9223372036854775808", false)
	f.Add(uint8(5), "-1", false)
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, route uint8, id string, asStudent bool) {
		fuzzServe(t, a, request{method: http.MethodGet, path: getRoutes[int(route)%len(getRoutes)] + id, authorization: auth(asStudent)})
	})
}

func FuzzListDeadLetters(f *testing.F) {
	f.Add("status=open&limit=100")
	f.Add("status=resolved&stage=consume&limit=1")
	f.Add("limit=0")
	f.Add("limit=99999999999999999999")
	f.Add("status=%zz&stage=publish")
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, query string) {
		fuzzServe(t, a, request{method: http.MethodGet, path: "/v1/dead-letters", query: query, authorization: auth(false)})
	})
}

func FuzzDeadLetterDecision(f *testing.F) {
	f.Add("1", false, []byte(nil))
	f.Add("0", true, []byte(`{}`))
	f.Add("1e3", false, []byte(`x`))
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, id string, compensate bool, body []byte) {
		action := "/retry"
		if compensate {
			action = "/compensate"
		}
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/dead-letters/" + id + action, contentType: jsonType,
			body: body, authorization: auth(false)})
	})
}

func FuzzCreateVendor(f *testing.F) {
	f.Add(jsonType, []byte(`{"id":"v-1","name":"Book shop"}`))
	f.Add(jsonType, []byte(`{"name":"   "}`))
	f.Add(jsonType, []byte(`{"name":null}`))
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/vendors", contentType: ctype, body: body, authorization: auth(false)})
	})
}

func FuzzCreateCouponType(f *testing.F) {
	f.Add(jsonType, []byte(`{"id":"ct-1","vendor_id":"v-1","name":"10% off","stock":100,"payout_cents":500}`))
	f.Add(jsonType, []byte(`{"vendor_id":"v-1","name":"x","stock":100,"payout_cents":0}`))
	f.Add(jsonType, []byte(`{"vendor_id":"v-1","name":"x","stock":1.5,"payout_cents":1}`))
	f.Add(jsonType, []byte(`{"vendor_id":"v-1","name":"x","stock":1,"payout_cents":9223372036854775808}`))
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/coupon-types", contentType: ctype, body: body, authorization: auth(false)})
	})
}

func FuzzIssueCoupon(f *testing.F) {
	f.Add("ct-1", jsonType, []byte(`{"user_id":"s-1"}`), true)
	f.Add("ct-1", jsonType, []byte(`{"user_id":"s-2"}`), true)
	f.Add("ct-1", jsonType, []byte(`{"user_id":"s-2"}`), false)
	f.Add("ct 1", "application/json; charset=utf-8", []byte(`{"user_id":""}`), false)
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, typeID, ctype string, body []byte, asStudent bool) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/coupon-types/" + typeID + "/coupons", contentType: ctype,
			body: body, authorization: auth(asStudent)})
	})
}

func FuzzUseCoupon(f *testing.F) {
	f.Add("k-1", jsonType, []byte(`{"user_id":"s-1","order_id":"o-1"}`), true)
	f.Add("k-1", jsonType, []byte(`{"user_id":"s-1","order_id":"o 1"}`), true)
	f.Add("k-1", jsonType, []byte(`{"user_id":"s-2"}`), true)
	a, auth := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, couponID, ctype string, body []byte, asStudent bool) {
		fuzzServe(t, a, request{method: http.MethodPost, path: "/v1/coupons/" + couponID + "/use", contentType: ctype,
			body: body, authorization: auth(asStudent)})
	})
}

// FuzzAuthorization throws arbitrary Authorization headers at a claim route.
func FuzzAuthorization(f *testing.F) {
	f.Add("Bearer " + token(f, "s-1", "", time.Hour))
	f.Add("Bearer " + token(f, "admin-1", RoleAdmin, -time.Hour))
	f.Add("Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.")
	f.Add("Bearer a.b.c")
	f.Add("Basic YTpi")
	f.Add("bearer    x")
	a, _ := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, authz string) {
		r := request{method: http.MethodPost, path: "/v1/courses/c1/enrollments", contentType: jsonType,
			body: []byte(`{"student_id":"s-1"}`), authorization: authz}
		a.logs.take()
		rec := a.serve(r)
		a.checkAnswer(t, r, rec)
		if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusNotFound {
			t.Fatalf("Authorization %q = %d %s", authz, rec.Code, rec.Body.String())
		}
	})
}

// FuzzParseJWKS: a key set document from the network never panics the
// parser, and every key it accepts is usable for RS256.
func FuzzParseJWKS(f *testing.F) {
	k := testRSAKeys(f)
	f.Add(string(jwksDoc(map[string]*rsa.PublicKey{"k1": &k[0].PublicKey})))
	f.Add(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}`)
	f.Add(`{"keys":[{"kty":"RSA","kid":"x","n":"` + "_-" + `","e":"AAAAAAAAAAAAAAE"}]}`)
	f.Add(`{"keys":null}`)
	f.Fuzz(func(t *testing.T, doc string) {
		keys, err := parseJWKS([]byte(doc))
		if err != nil {
			return
		}
		for kid, key := range keys {
			if key.N.BitLen() < minRSABits || key.E < 3 || key.E%2 == 0 {
				t.Fatalf("kid %q: accepted a weak key (%d bits, e=%s)", kid, key.N.BitLen(), strconv.Itoa(key.E))
			}
		}
	})
}
