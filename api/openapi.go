package api

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// openAPIDocument is the API's contract, kept in the repository as
// api/openapi.json; TestOpenAPIMatchesRouter keeps it and the router in step.
//
//go:embed openapi.json
var openAPIDocument []byte

// serveOpenAPI answers GET /openapi.json (no token needed).
func serveOpenAPI(c *gin.Context) {
	c.Data(http.StatusOK, "application/json", openAPIDocument)
}
