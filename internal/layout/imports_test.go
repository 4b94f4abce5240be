package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/claimflow/claimflow/"

// mayImport lists, for each package of this module, the packages of this
// module it may import. docs/architecture.md shows the same table; a
// package missing here fails the test, so a new room gets a rule.
var mayImport = map[string][]string{
	"workflows":             {},
	"activities":            {"workflows", "internal/buckets", "internal/kafka", "internal/store"},
	"api":                   {"workflows", "internal/buckets", "internal/config", "internal/store"},
	"worker":                {"workflows", "internal/buckets"},
	"consumer":              {"workflows", "internal/config", "internal/kafka", "internal/store"},
	"internal/kafka":        {"workflows"},
	"internal/store":        {"workflows"},
	"internal/config":       {"internal/kafka"},
	"internal/buckets":      {},
	"internal/memtrim":      {},
	"internal/audit":        {"workflows", "internal/kafka", "internal/store", "internal/notifysim"},
	"internal/notifysim":    {"consumer"},
	"internal/payoutsim":    {},
	"internal/devstack":     {},
	"internal/store/pgtest": {"internal/devstack", "internal/store"},
	"internal/bench":        {"workflows", "internal/kafka", "internal/store"},
	"internal/services": {"workflows", "activities", "api", "worker", "consumer", "internal/config", "internal/devstack",
		"internal/kafka", "internal/notifysim", "internal/payoutsim", "internal/store"},
	"internal/layout":     {},
	"cmd/claimflow":       {"api", "worker", "internal/audit", "internal/config", "internal/memtrim", "internal/services", "workflows"},
	"cmd/claimflow-bench": {"api", "internal/bench", "internal/config", "internal/kafka", "internal/store", "worker", "workflows"},
	"deploy":              {},
	"deploy/kafka":        {},
}

// TestImportsFollowTheLayers lists every package's non-test imports with
// `go list` and fails on an import its row does not allow.
func TestImportsFollowTheLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		allowed, ok := mayImport[pkg]
		if !ok {
			t.Errorf("package %s has no row in mayImport (and in docs/architecture.md): give it one", pkg)
			continue
		}
		seen++
		for _, imp := range fields[1:] {
			ours, isOurs := strings.CutPrefix(imp, module)
			if isOurs && !slices.Contains(allowed, ours) {
				t.Errorf("%s imports %s, which its row does not allow (docs/architecture.md, Who may import whom)", pkg, ours)
			}
		}
	}
	if seen < len(mayImport)-2 {
		t.Errorf("go list named only %d of the %d packages in the table", seen, len(mayImport))
	}
}
