package layout

import (
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/claimflow/claimflow/"

// mayImport lists, for each package of this module, the packages of this
// module it may import. docs/architecture.md shows the same table
// (TestArchitectureTableIsMayImport ties them); a package missing here
// fails the test, so a new room gets a rule.
var mayImport = map[string][]string{
	"workflows":             {},
	"activities":            {"workflows", "internal/buckets", "internal/kafka", "internal/store", "internal/tracing"},
	"api":                   {"workflows", "internal/buckets", "internal/config", "internal/store", "internal/tracing"},
	"worker":                {"workflows", "internal/buckets"},
	"consumer":              {"workflows", "internal/config", "internal/kafka", "internal/store", "internal/tracing"},
	"internal/kafka":        {"workflows", "internal/tlsfiles"},
	"internal/store":        {"workflows"},
	"internal/config":       {"internal/kafka", "internal/tlsfiles"},
	"internal/tracing":      {},
	"internal/tlsfiles":     {},
	"internal/temporalconn": {"internal/config"},
	"internal/buckets":      {},
	"internal/memtrim":      {},
	"dev/audit":             {"workflows", "internal/kafka", "internal/store", "dev/notifysim"},
	"dev/notifysim":         {"consumer", "dev/simserver"},
	"dev/payoutsim":         {"dev/simserver"},
	"dev/simserver":         {},
	"dev/devstack":          {},
	"dev/pgtest":            {"dev/devstack", "internal/store"},
	"dev/testcerts":         {},
	"bench":                 {"workflows", "internal/kafka", "internal/store"},
	"cmd/internal/services": {"workflows", "activities", "api", "worker", "consumer", "internal/config", "internal/temporalconn", "dev/devstack",
		"internal/kafka", "dev/notifysim", "dev/payoutsim", "internal/store", "internal/tracing"},
	"internal/layout":     {},
	"cmd/claimflow":       {"api", "worker", "dev/audit", "internal/config", "internal/memtrim", "cmd/internal/services", "workflows", "internal/tracing"},
	"cmd/claimflow-bench": {"api", "bench", "dev/audit", "internal/config", "internal/kafka", "internal/store", "internal/temporalconn", "worker", "workflows"},
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

// TestArchitectureTableIsMayImport holds docs/architecture.md's "Who may
// import whom" table to mayImport, row for row: a rule changed in one place
// and not the other fails here. A row's first cell names one or more
// packages, its second the packages they may import ("nothing" for none);
// parenthesised remarks are prose.
func TestArchitectureTableIsMayImport(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Who may import whom\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Who may import whom" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	backticked := regexp.MustCompile("`([^`]+)`")
	remark := regexp.MustCompile(`\([^)]*\)`)
	names := func(cell string) []string {
		var out []string
		for _, m := range backticked.FindAllStringSubmatch(remark.ReplaceAllString(cell, ""), -1) {
			out = append(out, m[1])
		}
		return out
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) != 2 {
			continue
		}
		may := names(cells[1])
		if strings.TrimSpace(cells[1]) != "nothing" && len(may) == 0 {
			t.Errorf("row %q: its second cell names no package and is not \"nothing\"", line)
		}
		for _, pkg := range names(cells[0]) {
			documented[pkg] = true
			want, ok := mayImport[pkg]
			if !ok {
				t.Errorf("docs/architecture.md has a row for %s, mayImport has none", pkg)
				continue
			}
			if !sameSet(may, want) {
				t.Errorf("%s may import %v by docs/architecture.md, %v by mayImport", pkg, sorted(may), sorted(want))
			}
		}
	}
	for pkg := range mayImport {
		if !documented[pkg] {
			t.Errorf("mayImport has a row for %s, docs/architecture.md has none", pkg)
		}
	}
	if len(documented) == 0 {
		t.Fatal("no table rows read from docs/architecture.md")
	}
}

func sameSet(a, b []string) bool { return slices.Equal(sorted(a), sorted(b)) }

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// productRooms are the product's packages by top-level folder: the service
// and what it stands on. They never import the tooling wing (dev/, bench/)
// nor the commands (cmd/), which wire them.
var productRooms = []string{"api", "workflows", "activities", "consumer", "worker", "internal"}

// TestTopLevelFoldersImportDownwards reads every package's non-test imports
// as arrows between top-level folders and fails on an arrow from the
// product to the tooling or the commands, and on any cycle among the
// folders: with none, every arrow runs downwards.
func TestTopLevelFoldersImportDownwards(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	top := func(pkg string) string { first, _, _ := strings.Cut(pkg, "/"); return first }
	arrows := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		from := top(strings.TrimPrefix(fields[0], module))
		for _, imp := range fields[1:] {
			ours, isOurs := strings.CutPrefix(imp, module)
			if !isOurs || top(ours) == from {
				continue
			}
			if arrows[from] == nil {
				arrows[from] = map[string]bool{}
			}
			arrows[from][top(ours)] = true
			if slices.Contains(productRooms, from) && !slices.Contains(productRooms, top(ours)) {
				t.Errorf("%s (product) imports %s: the product never imports the tooling or the commands", fields[0], imp)
			}
		}
	}
	// A cycle is a folder reached again while its own arrows are walked.
	state := map[string]int{} // 1 walking, 2 done
	var walk func(f string, path []string)
	walk = func(f string, path []string) {
		switch state[f] {
		case 1:
			t.Errorf("the top-level folders import each other in a circle: %s", strings.Join(append(path, f), " → "))
			return
		case 2:
			return
		}
		state[f] = 1
		for _, to := range slices.Sorted(maps.Keys(arrows[f])) {
			walk(to, append(path, f))
		}
		state[f] = 2
	}
	for _, f := range slices.Sorted(maps.Keys(arrows)) {
		walk(f, nil)
	}
	if len(arrows) < 5 {
		t.Fatalf("only %d folders with arrows read; go list answered too little", len(arrows))
	}
}
