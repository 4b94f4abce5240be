package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

func TestStatusesMatchTheWorkflows(t *testing.T) {
	for store, wf := range map[string]string{
		EnrollmentReserved:     string(workflows.StatusReserved),
		EnrollmentConfirmed:    string(workflows.StatusConfirmed),
		EnrollmentDeadLettered: string(workflows.StatusDeadLettered),
		EnrollmentWaitlisted:   string(workflows.StatusWaitlisted),
		CouponUsed:             string(workflows.CouponUsed),
		CouponRevoked:          string(workflows.CouponRevoked),
		DeadLetterOpen:         string(workflows.DeadLetterOpen),
		DeadLetterRetrying:     string(workflows.DeadLetterRetrying),
		DeadLetterCompensating: string(workflows.DeadLetterCompensating),
		DeadLetterResolved:     string(workflows.DeadLetterResolved),
	} {
		if store != wf {
			t.Errorf("store has %q where the workflows have %q", store, wf)
		}
	}
}

// computedLabels are quoted words the SQL produces rather than stores: the
// consumer labels an event it looked up as delivered or parked.
var computedLabels = map[string]bool{"delivered": true, "parked": true}

// TestSQLStatusLiteralsAreTheSchemas ties the status words written inside
// the effects' SQL (activities/, consumer/, this package) to the values the
// schema's CHECK constraints allow. A typo in a predicate ('confirmd')
// would not fail in Postgres — it would quietly match nothing.
func TestSQLStatusLiteralsAreTheSchemas(t *testing.T) {
	allowed := map[string]bool{}
	inList := regexp.MustCompile(`IN \(([^)]*)\)`)
	quoted := regexp.MustCompile(`'([a-z_]+)'`)
	migrations, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(migrations) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	for _, m := range migrations {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range inList.FindAllStringSubmatch(string(b), -1) {
			for _, q := range quoted.FindAllStringSubmatch(list[1], -1) {
				allowed[q[1]] = true
			}
		}
	}
	checked := 0
	for _, dir := range []string{".", "../../activities", "../../consumer"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(parsed, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING || !isSQL(lit.Value) {
					return true
				}
				for _, q := range quoted.FindAllStringSubmatch(lit.Value, -1) {
					checked++
					if !allowed[q[1]] && !computedLabels[q[1]] {
						t.Errorf("%s: SQL compares with '%s', which no CHECK constraint in migrations/ allows", f, q[1])
					}
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("found no quoted status in any SQL: the scan is broken")
	}
	t.Logf("%d quoted words in SQL checked against %d values the schema allows", checked, len(allowed))
}

func isSQL(s string) bool {
	for _, kw := range []string{"SELECT", "UPDATE", "INSERT", "DELETE", "WHERE"} {
		if strings.Contains(s, kw) {
			return true
		}
	}
	return false
}

func TestStatusListsAreTheChecks(t *testing.T) {
	// A table's status CHECK is in its CREATE TABLE, or re-added by a later
	// migration (ALTER TABLE … ADD CONSTRAINT <table>_status_check CHECK …):
	// the last one read, in migration order, is the schema's.
	table := regexp.MustCompile(`^CREATE TABLE (\w+) \(`)
	check := regexp.MustCompile(`^\s+status\s+text NOT NULL CHECK \(status IN \(([^)]*)\)\)`)
	readded := regexp.MustCompile(`ALTER TABLE (\w+) ADD CONSTRAINT \w+_status_check\s+CHECK \(status IN \(([^)]*)\)\)`)
	quoted := regexp.MustCompile(`'([a-z_]+)'`)
	schema := map[string][]string{}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range files {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		up, _, _ := strings.Cut(string(b), "-- +goose Down")
		current := ""
		for _, line := range strings.Split(up, "\n") {
			if m := table.FindStringSubmatch(line); m != nil {
				current = m[1]
			}
			if m := check.FindStringSubmatch(line); m != nil {
				schema[current] = nil
				for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
					schema[current] = append(schema[current], q[1])
				}
			}
		}
		for _, m := range readded.FindAllStringSubmatch(up, -1) {
			schema[m[1]] = nil
			for _, q := range quoted.FindAllStringSubmatch(m[2], -1) {
				schema[m[1]] = append(schema[m[1]], q[1])
			}
		}
	}
	for table, list := range map[string][]string{"enrollments": EnrollmentStatuses, "coupons": CouponStatuses} {
		if strings.Join(schema[table], ",") != strings.Join(list, ",") {
			t.Errorf("%s: the schema allows %v, the list says %v", table, schema[table], list)
		}
	}
}
