package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The threat model in docs/security.md names, per asset, the tests that
// prove its controls. This test holds every name to a test function of the
// repository, so a renamed or deleted test fails here instead of leaving the
// table pointing at nothing.
const (
	threatModelBegin = "<!-- threat model: every backticked Test/Fuzz name is checked by internal/layout TestThreatModelNamesRealTests -->"
	threatModelEnd   = "<!-- end of the threat model -->"
	// threatModelMinRows is the assets the table covers today; a table
	// shrunk by accident (a lost marker, a bad merge) fails.
	threatModelMinRows = 13
)

var (
	testNameInDoc  = regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`")
	testFuncInCode = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
)

// testFuncs is every Test and Fuzz function declared in a _test.go file
// under root.
func testFuncs(t *testing.T, root string) map[string]bool {
	t.Helper()
	funcs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFuncInCode.FindAllStringSubmatch(string(src), -1) {
			funcs[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the repository: %v", err)
	}
	return funcs
}

// threatModelRows is the table's rows (header and separator left out),
// each split into its cells.
func threatModelRows(t *testing.T, doc string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, threatModelBegin)
	if !ok {
		t.Fatalf("docs/security.md has no threat model table: the line %q is missing", threatModelBegin)
	}
	table, _, ok := strings.Cut(rest, threatModelEnd)
	if !ok {
		t.Fatalf("docs/security.md's threat model has no end marker %q", threatModelEnd)
	}
	var rows [][]string
	for i, line := range strings.Split(strings.TrimSpace(table), "\n") {
		if i < 2 { // the header and the |---| line
			continue
		}
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
			t.Fatalf("threat model line %d is not a table row: %q", i+1, line)
		}
		rows = append(rows, strings.Split(strings.Trim(line, "|"), " | "))
	}
	return rows
}

func TestThreatModelNamesRealTests(t *testing.T) {
	raw, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	funcs := testFuncs(t, "../..")
	// The scanner itself: it must see this very test and the import test
	// next to it, or every name below would be "missing" for a wrong reason.
	for _, own := range []string{"TestThreatModelNamesRealTests", "TestImportsFollowTheLayers"} {
		if !funcs[own] {
			t.Fatalf("the scan of the repository's tests did not find %s: it is broken", own)
		}
	}
	rows := threatModelRows(t, string(raw))
	if len(rows) < threatModelMinRows {
		t.Errorf("the threat model has %d rows, want at least %d", len(rows), threatModelMinRows)
	}
	for _, cells := range rows {
		asset := strings.TrimSpace(cells[0])
		t.Run(asset, func(t *testing.T) {
			if len(cells) != 4 {
				t.Fatalf("%d cells, want 4 (asset | who might attack it | control | proved by): %q", len(cells), cells)
			}
			names := testNameInDoc.FindAllStringSubmatch(cells[3], -1)
			if len(names) == 0 {
				t.Fatalf("no test proves the control: name at least one test function, in backticks, in the last column")
			}
			for _, m := range names {
				if !funcs[m[1]] {
					t.Errorf("%s is not a test function of this repository (renamed or deleted?): fix the row or the test", m[1])
				}
			}
		})
	}
}
