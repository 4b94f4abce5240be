package api

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type openAPIOperation struct {
	OperationID  string                     `json:"operationId"`
	Security     *[]map[string][]string     `json:"security"`
	Parameters   []map[string]any           `json:"parameters"`
	RequestBody  map[string]any             `json:"requestBody"`
	Responses    map[string]json.RawMessage `json:"responses"`
	RequiredRole string                     `json:"x-required-role"`
	Owner        string                     `json:"x-owner"`
	ActsAs       string                     `json:"x-acts-as"`
	Catalogue    bool                       `json:"x-catalogue"`
}

type openAPIDoc struct {
	OpenAPI    string                                 `json:"openapi"`
	Security   []map[string][]string                  `json:"security"`
	Paths      map[string]map[string]openAPIOperation `json:"paths"`
	Components struct {
		SecuritySchemes map[string]struct {
			Type, Scheme, BearerFormat string
		} `json:"securitySchemes"`
		Parameters map[string]map[string]any `json:"parameters"`
	} `json:"components"`
}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("api/openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	return doc
}

var ginParam = regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)

// ginToOpenAPI turns /v1/courses/:id into /v1/courses/{id}.
func ginToOpenAPI(path string) string { return ginParam.ReplaceAllString(path, "{$1}") }

// TestOpenAPIMatchesRouter fails when a route is served but not documented,
// or documented but not served.
func TestOpenAPIMatchesRouter(t *testing.T) {
	doc := loadOpenAPI(t)
	served := map[string]bool{}
	for _, r := range newTestAPI(t, Security{}).engine(t).Routes() {
		served[r.Method+" "+ginToOpenAPI(r.Path)] = true
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	for route := range served {
		if !documented[route] {
			t.Errorf("%s is served but not in api/openapi.json", route)
		}
	}
	for route := range documented {
		if !served[route] {
			t.Errorf("%s is in api/openapi.json but not served", route)
		}
	}
	if len(served) < 20 {
		t.Fatalf("only %d routes served", len(served))
	}
}

// TestRoutePolicies: every /v1 route has a policy that says who may call
// it, and the document says the same about it (token, admin, catalogue,
// owner, acts-as, 403/404/429).
func TestRoutePolicies(t *testing.T) {
	doc := loadOpenAPI(t)
	if s := doc.Components.SecuritySchemes["bearerAuth"]; s.Type != "http" || s.Scheme != "bearer" || s.BearerFormat != "JWT" {
		t.Errorf("securitySchemes.bearerAuth = %+v", s)
	}
	if len(doc.Security) != 1 || doc.Security[0]["bearerAuth"] == nil {
		t.Errorf("the document's default security is %v, want bearerAuth", doc.Security)
	}
	routes := map[string]bool{}
	for _, r := range newTestAPI(t, Security{}).engine(t).Routes() {
		key := r.Method + " " + r.Path
		routes[key] = true
		op := doc.Paths[ginToOpenAPI(r.Path)][strings.ToLower(r.Method)]
		if !strings.HasPrefix(r.Path, "/v1/") {
			if op.Security == nil || len(*op.Security) != 0 {
				t.Errorf("%s needs no token; the document must say security: []", key)
			}
			continue
		}
		p, ok := routePolicies[key]
		if !ok {
			t.Errorf("%s has no entry in routePolicies (it is admin-only until it gets one)", key)
			continue
		}
		if op.Security != nil && len(*op.Security) == 0 {
			t.Errorf("%s needs a token but the document says security: []", key)
		}
		if (op.RequiredRole == RoleAdmin) != p.admin {
			t.Errorf("%s: x-required-role %q, policy admin=%v", key, op.RequiredRole, p.admin)
		}
		if op.Owner != p.owner || op.ActsAs != p.actsAs || op.Catalogue != p.catalogue {
			t.Errorf("%s: the document says x-owner %q, x-acts-as %q, x-catalogue %v; the policy %q, %q, %v",
				key, op.Owner, op.ActsAs, op.Catalogue, p.owner, p.actsAs, p.catalogue)
		}
		// Exactly one answer to "who may": admins only, anyone (catalogue),
		// or the owner / the subject itself.
		kinds := 0
		for _, set := range []bool{p.admin, p.catalogue, p.owner != "" || p.actsAs != ""} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			t.Errorf("%s: policy %+v must be exactly one of admin, catalogue, owner/actsAs", key, p)
		}
		if _, ok := ownerRules[p.owner]; p.owner != "" && !ok {
			t.Errorf("%s: owner rule %q is not in ownerRules", key, p.owner)
		}
		if p.catalogue && r.Method != http.MethodGet {
			t.Errorf("%s: only reads can be catalogue reads", key)
		}
		for code, want := range map[string]bool{"401": true, "403": p.admin || p.actsAs != "", "404": p.owner != "",
			"429": p.write || p.claim,
			"413": op.RequestBody != nil, "415": op.RequestBody != nil} {
			if _, has := op.Responses[code]; want && !has {
				t.Errorf("%s: the document lists no %s answer", key, code)
			}
		}
	}
	for key := range routePolicies {
		if !routes[key] {
			t.Errorf("routePolicies has %s, which is not served", key)
		}
	}
}

// TestOpenAPIReferencesResolve: every $ref points into the document and
// every path parameter is declared.
func TestOpenAPIReferencesResolve(t *testing.T) {
	doc := loadOpenAPI(t)
	var raw any
	if err := json.Unmarshal(openAPIDocument, &raw); err != nil {
		t.Fatal(err)
	}
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok && resolve(raw, ref) == nil {
				t.Errorf("%s: $ref %q does not resolve", at, ref)
			}
			for k, x := range v {
				walk(x, at+"/"+k)
			}
		case []any:
			for _, x := range v {
				walk(x, at+"[]")
			}
		}
	}
	walk(raw, "#")

	for path, ops := range doc.Paths {
		want := ginParam.FindAllString(strings.NewReplacer("{", ":", "}", "").Replace(path), -1)
		for method, op := range ops {
			var declared []string
			for _, p := range op.Parameters {
				if ref, ok := p["$ref"].(string); ok {
					p, _ = resolve(raw, ref).(map[string]any)
				}
				if p["in"] == "path" {
					declared = append(declared, ":"+p["name"].(string))
				}
			}
			slices.Sort(want)
			slices.Sort(declared)
			if !slices.Equal(want, declared) {
				t.Errorf("%s %s declares path parameters %v, the path has %v", method, path, declared, want)
			}
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
		}
	}
}

func resolve(doc any, ref string) any {
	if !strings.HasPrefix(ref, "#/") {
		return nil
	}
	cur := doc
	for _, part := range strings.Split(ref[2:], "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[strings.NewReplacer("~1", "/", "~0", "~").Replace(part)]
	}
	return cur
}

func TestOpenAPIServedMatchesRepo(t *testing.T) {
	rec := newTestAPI(t, Security{}).serve(request{method: http.MethodGet, path: "/openapi.json"})
	if rec.Code != http.StatusOK || rec.Body.String() != string(openAPIDocument) {
		t.Fatalf("GET /openapi.json = %d, %d bytes; want the embedded document", rec.Code, rec.Body.Len())
	}
}
