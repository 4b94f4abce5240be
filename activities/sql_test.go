package activities

// Parameterized SQL only: every SQL string handed to pgx (Exec, Query,
// QueryRow, batch Queue, Prepare, and their database/sql *Context twins) in
// activities/, api/, cmd/, consumer/ and internal/ must be a constant expression — a literal, a
// const, or constants joined with + — so values can only reach Postgres as
// $n parameters, never spliced into the statement text.

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// sqlArg says which argument of a method call is the SQL text.
var sqlArg = map[string]int{
	"Exec": 1, "Query": 1, "QueryRow": 1, // pgx: (ctx, sql, args...)
	"ExecContext": 1, "QueryContext": 1, "QueryRowContext": 1,
	"Prepare": 2, // pgx: (ctx, name, sql)
	"Queue":   0, // pgx.Batch: (sql, args...)
}

// sqlAllowed lists functions (file:function) whose SQL is built from
// identifiers chosen in code, with the reason; each must still hold a
// non-constant SQL call, so a fixed one has to leave the list.
var sqlAllowed = map[string]string{
	// The benchmark reads the same queries from claimflow's tables or from
	// its outbox peer's: the table names come from the package variables
	// ClaimflowSchema and PeerSchema, never from input, and the values are
	// still $n parameters. (To leave the list: one constant query per schema.)
	"bench/audit.go:stageLatencies":    "table names from bench.ClaimflowSchema/PeerSchema",
	"bench/audit.go:drain":             "table names from bench.ClaimflowSchema/PeerSchema",
	"bench/audit.go:audit":             "table names from bench.ClaimflowSchema/PeerSchema",
	"bench/audit.go:confirmedRate":     "table names from bench.ClaimflowSchema/PeerSchema",
	"bench/audit.go:peakConfirmedRate": "table names from bench.ClaimflowSchema/PeerSchema",
	// Test helpers that take the statement from their callers, each of
	// which passes a constant.
	"internal/store/grants.go:GrantRuntime":                                "GRANT takes no parameters: the role quoted by pgx.Identifier, privileges and objects from the constant RuntimeGrants",
	"internal/store/roles_pg_test.go:TestRuntimeRoleCannotChangeTheSchema": "a table of constant statements",
	"api/deadletters_pg_test.go:TestDeadLetterDecisionsAreTakenOnce":       "a table of constant fixture statements",
	"internal/store/lists_test.go:loadLists":                               "a table of constant statements",
	"internal/store/lists_test.go:TestListsUseTheirIndexes":                "EXPLAIN of the store's constant list statements",
	"cmd/claimflow/replicas_test.go:queryInt":                              "test helper; callers pass constant SQL",
	"cmd/claimflow/replicas_test.go:queryStrings":                          "test helper; callers pass constant SQL",
	// The API's pool wrapper (requestDB) swaps a *gin.Context for its
	// request's context and forwards the statement of its callers, the
	// store's functions, whose constant SQL this scan checks where they are.
	"api/api.go:Exec":     "requestDB forwards the store's constant SQL",
	"api/api.go:Query":    "requestDB forwards the store's constant SQL",
	"api/api.go:QueryRow": "requestDB forwards the store's constant SQL",
}

var sqlRoots = []string{".", "../api", "../bench", "../cmd", "../consumer", "../dev", "../internal", "../worker", "../workflows"}

type sqlFinding struct {
	pos      token.Position
	function string
	expr     string
}

func TestSQLIsParameterized(t *testing.T) {
	fset := token.NewFileSet()
	var findings []sqlFinding
	checked := 0
	for _, root := range sqlRoots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); path != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
					return filepath.SkipDir
				}
				// The dev stack provisions a private cluster (CREATE
				// DATABASE of a name chosen in code); it serves no request.
				if filepath.ToSlash(path) == "../dev/devstack" {
					return filepath.SkipDir
				}
				f, n, err := checkSQLDir(fset, path)
				findings = append(findings, f...)
				checked += n
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 40 {
		t.Fatalf("only %d SQL calls found; is the scan still finding pgx calls?", checked)
	}
	used := map[string]bool{}
	for _, f := range findings {
		key := filepath.ToSlash(relToRepo(f.pos.Filename)) + ":" + f.function
		if _, ok := sqlAllowed[key]; ok {
			used[key] = true
			continue
		}
		t.Errorf("%s: SQL built at run time in %s: %s\n\tpass values as $n parameters; keep the statement a constant",
			f.pos, f.function, f.expr)
	}
	for key := range sqlAllowed {
		if !used[key] {
			t.Errorf("sqlAllowed lists %s, which builds no SQL at run time any more: remove it", key)
		}
	}
	t.Logf("%d SQL calls checked", checked)
}

func relToRepo(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	root, err := filepath.Abs("..")
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return path
	}
	return rel
}

// checkSQLDir type-checks each package of dir on its own (imports are left
// unresolved: only the package's own constants matter) and returns the SQL
// calls whose SQL is not a constant string, and how many calls it checked.
func checkSQLDir(fset *token.FileSet, dir string) ([]sqlFinding, int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	byPkg := map[string][]*ast.File{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, 0, err
		}
		byPkg[f.Name.Name] = append(byPkg[f.Name.Name], f)
	}
	names := make([]string, 0, len(byPkg))
	for n := range byPkg {
		names = append(names, n)
	}
	sort.Strings(names)
	var findings []sqlFinding
	checked := 0
	for _, name := range names {
		f, n := checkSQLPackage(fset, byPkg[name])
		findings = append(findings, f...)
		checked += n
	}
	return findings, checked, nil
}

func checkSQLPackage(fset *token.FileSet, files []*ast.File) ([]sqlFinding, int) {
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{
		Importer: noImports{},
		Error:    func(error) {}, // unresolved imports are expected
	}
	_, _ = conf.Check(files[0].Name.Name, fset, files, info)
	var findings []sqlFinding
	checked := 0
	for _, file := range files {
		for _, decl := range file.Decls {
			fn := "(package)"
			if fd, ok := decl.(*ast.FuncDecl); ok {
				fn = fd.Name.Name
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				i, ok := sqlArg[sel.Sel.Name]
				if !ok || len(call.Args) <= i || (i > 0 && len(call.Args) < 2) {
					return true
				}
				// database/sql style (sql, args...): the SQL comes first.
				if i == 1 && isStringConst(info, call.Args[0]) {
					i = 0
				}
				checked++
				if !isStringConst(info, call.Args[i]) {
					findings = append(findings, sqlFinding{pos: fset.Position(call.Args[i].Pos()), function: fn,
						expr: types.ExprString(call.Args[i])})
				}
				return true
			})
		}
	}
	return findings, checked
}

func isStringConst(info *types.Info, e ast.Expr) bool {
	tv, ok := info.Types[e]
	return ok && tv.Value != nil && tv.Value.Kind() == constant.String
}

// noImports resolves every import to an empty package, so only the checked
// package's own declarations have types.
type noImports struct{}

func (noImports) Import(path string) (*types.Package, error) {
	name := path[strings.LastIndex(path, "/")+1:]
	pkg := types.NewPackage(path, name)
	pkg.MarkComplete()
	return pkg, nil
}

var _ types.Importer = noImports{}

// TestSQLCheckCatchesSplicing makes sure the check itself tells constant
// SQL from SQL built at run time.
func TestSQLCheckCatchesSplicing(t *testing.T) {
	const src = `package p
import ("context"; "fmt")
type db interface{ Exec(context.Context, string, ...any) (any, error); QueryRow(context.Context, string, ...any) any }
const cols = "id, name"
func ok(ctx context.Context, d db, id string) {
	d.Exec(ctx, "DELETE FROM t WHERE id = $1", id)
	d.QueryRow(ctx, ` + "`SELECT `+cols+` FROM t WHERE id = $1`" + `, id)
	const q = "SELECT 1"
	d.QueryRow(ctx, q)
}
func bad(ctx context.Context, d db, id, table string) {
	d.Exec(ctx, "DELETE FROM t WHERE id = '"+id+"'")
	d.QueryRow(ctx, fmt.Sprintf("SELECT * FROM %s", table))
	q := "SELECT 1"
	d.QueryRow(ctx, q)
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	findings, checked := checkSQLPackage(fset, []*ast.File{f})
	if checked != 6 {
		t.Fatalf("checked %d calls, want 6", checked)
	}
	if len(findings) != 3 {
		t.Fatalf("findings %v, want the 3 calls of bad", findings)
	}
	for _, f := range findings {
		if f.function != "bad" {
			t.Errorf("flagged %s in %s", f.expr, f.function)
		}
	}
}
