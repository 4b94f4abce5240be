package api

// FuzzTextOnPostgres sends titles, names and IDs to the create routes of
// a real PostgreSQL (pgtest), so that whatever the database refuses — a NUL
// byte in text, say — shows up as the 500 it would be in production; the
// fuzz targets of fuzz_test.go run on a database that is never there.
// `go test ./api/` runs its seeds as a test; `go test -fuzz=FuzzTextOnPostgres
// -run '^$' ./api/` explores.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/claimflow/claimflow/dev/pgtest"
)

func FuzzTextOnPostgres(f *testing.F) {
	for kind := range uint8(3) {
		for _, seed := range []struct{ id, text string }{
			{"", "Intro to CS"},
			{"", "Ünïcødé ☕ 📚"},
			{"", "nul\x00inside"},
			{"", "\x00"},
			{"", "tab\there"},
			{"", "line\nbreak"},
			{"", "unit\x1fseparator"},
			{"", "del\x7f"},
			{"", "c1\u0085control"},
			{"", "bad utf-8 \xff\xfe"},
			{"", "  padded  "},
			{"", strings.Repeat("é", 100)},
			{"", strings.Repeat("x", 201)},
			{"nul\x00id", "fine"},
			{"ok-id\n", "fine"},
			{"fz-ok", "an id that fits"},
		} {
			f.Add(kind, seed.id, seed.text)
		}
	}
	db, p := pgtest.DB(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vendorID := p + "v"
	if _, err := db.Exec(ctx, `INSERT INTO vendors (id, name) VALUES ($1, 'fuzz')`, vendorID); err != nil {
		f.Fatal(err)
	}
	a := pgTestAPI(f, db)
	admin := "Bearer " + token(f, "admin-1", RoleAdmin, 24*time.Hour)
	routes := []struct{ path, field, read string }{
		{"/v1/courses", "title", "/v1/courses/"},
		{"/v1/vendors", "name", "/v1/vendors/"},
		{"/v1/coupon-types", "name", "/v1/coupon-types/"},
	}

	f.Fuzz(func(t *testing.T, kind uint8, id, text string) {
		r := routes[int(kind)%len(routes)]
		body := map[string]any{r.field: text}
		if id != "" {
			body["id"] = id
		}
		switch r.path {
		case "/v1/courses":
			body["capacity"] = 5
		case "/v1/coupon-types":
			body["vendor_id"], body["stock"], body["payout_cents"] = vendorID, 1, 1
		}
		raw, err := json.Marshal(body)
		if err != nil {
			t.Skip("not JSON-encodable")
		}
		req := request{method: http.MethodPost, path: r.path, contentType: jsonType, body: raw, authorization: admin}
		a.logs.take()
		rec := a.serve(req)
		if rec.Code >= 500 {
			t.Fatalf("POST %s %s = %d %s\nlog: %s", r.path, raw, rec.Code, rec.Body.String(), a.logs.take())
		}
		// What JSON carried is what the server saw (invalid UTF-8 became U+FFFD).
		var sent map[string]any
		if err := json.Unmarshal(raw, &sent); err != nil {
			t.Fatal(err)
		}
		seen, _ := sent[r.field].(string)
		hasControl := strings.IndexFunc(seen, unicode.IsControl) >= 0
		switch rec.Code {
		case http.StatusCreated:
			if hasControl {
				t.Fatalf("POST %s stored %s with a control character", r.path, raw)
			}
			var got map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			gotID, _ := got["id"].(string)
			back := a.call(http.MethodGet, r.read+gotID, strings.TrimPrefix(admin, "Bearer "), nil)
			var read map[string]any
			if back.Code != http.StatusOK || json.Unmarshal(back.Body.Bytes(), &read) != nil || read[r.field] != strings.TrimSpace(seen) {
				t.Fatalf("read back %s = %d %s, want %s %q", gotID, back.Code, back.Body.String(), r.field, strings.TrimSpace(seen))
			}
		case http.StatusBadRequest:
			e := errorOf(t, rec)
			if e.Field == "" {
				t.Fatalf("400 without the field: %s", rec.Body.String())
			}
			if hasControl && id == "" && e.Field != r.field {
				t.Fatalf("%q refused on %q, want %q", seen, e.Field, r.field)
			}
		case http.StatusConflict:
			errorOf(t, rec)
		default:
			t.Fatalf("POST %s %s = %d %s", r.path, raw, rec.Code, rec.Body.String())
		}
	})
}
