package api

import (
	"fmt"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// maxTextBytes bounds a title or a name.
const maxTextBytes = 200

// validText checks a free-text field (a course title, a vendor or coupon
// type name): present and not blank, at most maxTextBytes, valid UTF-8,
// and free of control characters — U+0000–U+001F, U+007F and U+0080–U+009F
// (NUL, which Postgres refuses in text, tabs, newlines, escapes) — so what
// is stored is what a list or a log line can show. It answers 400 with the
// field otherwise. IDs have their own, stricter alphabet (validID).
func validText(c *gin.Context, field string, value *string) bool {
	switch {
	case value == nil || strings.TrimSpace(*value) == "":
		writeError(c, http.StatusBadRequest, "missing_field", field+" is required", field)
		return false
	case len(*value) > maxTextBytes:
		writeError(c, http.StatusBadRequest, "invalid_field", fmt.Sprintf("%s must be at most %d bytes", field, maxTextBytes), field)
		return false
	case !utf8.ValidString(*value):
		writeError(c, http.StatusBadRequest, "invalid_field", field+" must be valid UTF-8", field)
		return false
	case strings.IndexFunc(*value, unicode.IsControl) >= 0:
		writeError(c, http.StatusBadRequest, "invalid_field",
			field+" must not contain control characters (U+0000-U+001F, U+007F-U+009F)", field)
		return false
	}
	return true
}
