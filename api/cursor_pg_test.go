package api

// Tampered list cursors against a real PostgreSQL (pgtest): what the
// database would refuse (a NUL byte, invalid UTF-8, a time out of its
// range) must be refused by the cursor's decoder first, as 400
// invalid_field on after, never reach the query as a 500.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/pgtest"
)

func TestTamperedCursorsAre400(t *testing.T) {
	db, p := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := ownedRows(ctx, t, db, p)
	a := pgTestAPI(t, db)
	student := token(t, o.student, "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)

	// A cursor the API handed out: the student has two enrollments.
	rec := a.call(http.MethodGet, "/v1/students/"+o.student+"/enrollments?limit=1", student, nil)
	var page struct{ Next *string }
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &page) != nil || page.Next == nil {
		t.Fatalf("first page = %d %s, want 200 with a next cursor", rec.Code, rec.Body.String())
	}
	valid := *page.Next
	raw, err := base64.RawURLEncoding.DecodeString(valid)
	if err != nil {
		t.Fatalf("the API's own cursor %q: %v", valid, err)
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	micros, id, _ := strings.Cut(string(raw), ":")
	year10000 := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	year7000BC := time.Date(-7000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() // before PostgreSQL's 4713 BC

	keysetLists := []struct{ name, path, bearer string }{
		{"student's enrollments", "/v1/students/" + o.student + "/enrollments", student},
		{"roster", "/v1/courses/" + o.course + "/enrollments", admin},
		{"roster by status", "/v1/courses/" + o.course + "/enrollments?status=confirmed", admin},
		{"user's coupons", "/v1/users/" + o.student + "/coupons", student},
	}
	seqLists := []struct{ name, path, bearer string }{
		{"inbox", "/v1/users/" + o.student + "/notifications", student},
		{"unread inbox", "/v1/users/" + o.student + "/notifications?unread=true", student},
	}
	type cursorCase struct {
		name, after string
		want        int
	}
	keysetCursors := []cursorCase{
		{"NUL byte in the ID", enc(micros + ":" + id + "\x00"), http.StatusBadRequest},
		{"invalid UTF-8 in the ID", enc(micros + ":\xff\xfe"), http.StatusBadRequest},
		{"control character in the ID", enc(micros + ":a\x1bb"), http.StatusBadRequest},
		{"time after year 9999", enc(fmt.Sprint(year10000) + ":" + id), http.StatusBadRequest},
		{"time before 4713 BC", enc(fmt.Sprint(year7000BC) + ":" + id), http.StatusBadRequest},
		{"time before year 1", enc(fmt.Sprint(time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC).UnixMicro()) + ":" + id), http.StatusBadRequest},
		{"largest int64 time", enc("9223372036854775807:" + id), http.StatusBadRequest},
		{"smallest int64 time", enc("-9223372036854775808:" + id), http.StatusBadRequest},
		{"time with a plus sign", enc("+" + micros + ":" + id), http.StatusBadRequest},
		{"time with a leading zero", enc("0" + micros + ":" + id), http.StatusBadRequest},
		{"empty ID", enc(micros + ":"), http.StatusBadRequest},
		{"garbage base64", "!!not*base64!!", http.StatusBadRequest},
		{"base64 of binary garbage", enc("\x93\x00\x17:\xc3\x28"), http.StatusBadRequest},
		{"padded base64", base64.URLEncoding.EncodeToString(raw), http.StatusBadRequest},
		{"newline inside the base64", valid[:4] + "\n" + valid[4:], http.StatusBadRequest},
		{"too long", strings.Repeat("A", 513), http.StatusBadRequest},
		{"the API's own cursor", valid, http.StatusOK},
	}
	seqCursors := []cursorCase{
		{"zero", enc("0"), http.StatusBadRequest},
		{"negative", enc("-5"), http.StatusBadRequest},
		{"plus sign", enc("+5"), http.StatusBadRequest},
		{"leading zero", enc("05"), http.StatusBadRequest},
		{"NUL byte", enc("5\x00"), http.StatusBadRequest},
		{"beyond int64", enc("99999999999999999999"), http.StatusBadRequest},
		{"garbage base64", "%%%", http.StatusBadRequest},
		{"a sequence number", enc("5"), http.StatusOK},
	}

	check := func(t *testing.T, path, bearer string, c cursorCase) {
		t.Helper()
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		a.logs.take()
		rec := a.call(http.MethodGet, path+sep+url.Values{"after": {c.after}}.Encode(), bearer, nil)
		if rec.Code != c.want {
			t.Fatalf("after=%q: %d %s, want %d\nlog: %s", c.after, rec.Code, rec.Body.String(), c.want, a.logs.take())
		}
		if c.want == http.StatusBadRequest {
			if e := errorOf(t, rec); e.Code != "invalid_field" || e.Field != "after" {
				t.Fatalf("after=%q: error %+v, want invalid_field on after", c.after, e)
			}
		}
	}
	for _, l := range keysetLists {
		for _, c := range keysetCursors {
			t.Run(l.name+"/"+c.name, func(t *testing.T) { check(t, l.path, l.bearer, c) })
		}
	}
	for _, l := range seqLists {
		for _, c := range seqCursors {
			t.Run(l.name+"/"+c.name, func(t *testing.T) { check(t, l.path, l.bearer, c) })
		}
	}
}
