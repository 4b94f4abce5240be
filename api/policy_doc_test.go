package api

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// The route policy table in docs/security.md is generated from
// routePolicies; this test holds the two together.
const (
	policyTableBegin = "<!-- route policy table: generated from api/policy.go; TestSecurityDocShowsThePolicyTable prints it -->"
	policyTableEnd   = "<!-- end of the route policy table -->"
)

// policyTableMarkdown renders routePolicies: who may call each route and
// what anyone else gets.
func policyTableMarkdown() string {
	keys := PolicyRoutes()
	methodOrder := map[string]int{"GET": 0, "POST": 1, "DELETE": 2}
	slices.SortFunc(keys, func(a, b string) int {
		am, ap, _ := strings.Cut(a, " ")
		bm, bp, _ := strings.Cut(b, " ")
		if c := strings.Compare(ap, bp); c != 0 {
			return c
		}
		return methodOrder[am] - methodOrder[bm]
	})
	var b strings.Builder
	b.WriteString("| route | who may call it | anyone else (with a valid token) gets |\n|---|---|---|\n")
	for _, key := range keys {
		method, route, _ := strings.Cut(key, " ")
		p := routePolicies[key]
		var who, others string
		switch {
		case p.admin:
			who, others = "role `admin`", "403 `forbidden`"
		case p.catalogue:
			who, others = "any authenticated subject (a catalogue read: no one's personal data)", "—"
		case p.owner != "":
			r := ownerRules[p.owner]
			who = fmt.Sprintf("%s (`%s`); an admin", r.who, p.owner)
			others = fmt.Sprintf("404 `%s`, the answer of a missing ID", r.notFound)
			if p.actsAs != "" {
				who = fmt.Sprintf("%s (`%s`), acting as itself (`%s` = `sub`); an admin, for the owner", r.who, p.owner, p.actsAs)
				others += fmt.Sprintf("; 403 `forbidden` on `%s` when acting as someone else", p.actsAs)
			}
		default:
			who = fmt.Sprintf("any subject acting as itself (`%s` = `sub`); an admin, for anyone", p.actsAs)
			others = fmt.Sprintf("403 `forbidden` on `%s` when acting as someone else", p.actsAs)
		}
		fmt.Fprintf(&b, "| `%s %s` | %s | %s |\n", method, ginToOpenAPI(route), who, others)
	}
	return b.String()
}

func TestSecurityDocShowsThePolicyTable(t *testing.T) {
	raw, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	_, rest, ok := strings.Cut(doc, policyTableBegin+"\n")
	table, _, ok2 := strings.Cut(rest, policyTableEnd)
	if !ok || !ok2 {
		t.Fatalf("docs/security.md has no section between %q and %q", policyTableBegin, policyTableEnd)
	}
	if want := policyTableMarkdown(); table != want {
		t.Fatalf("docs/security.md's route policy table differs from api/policy.go; put this between the markers:\n%s", want)
	}
}
