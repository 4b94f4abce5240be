package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sqlStatement matches a string that starts an SQL statement.
var sqlStatement = regexp.MustCompile(`^\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s*\()`)

// sqlHomes are the directories whose code may hold SQL: the store (schema
// and the reads of the API and the audit), the sagas' effects and the
// consumer's. Everything else asks them.
var sqlHomes = []string{"internal/store", "activities", "consumer"}

// sqlExempt are the directories whose SQL serves no request: the dev
// stack's provisioning of its private cluster, and the bench, whose outbox
// peer keeps its own tables.
var sqlExempt = []string{"dev/devstack", "bench", "tools"}

// TestSQLLivesInTheStore fails when a non-test file outside the SQL homes
// holds an SQL statement: a query the API or a command needs belongs in the
// store, behind a function the caller names.
func TestSQLLivesInTheStore(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	homes := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(strings.TrimPrefix(path, root), string(filepath.Separator)))
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || under(rel, sqlExempt) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !sqlStatement.MatchString(s) {
				return true
			}
			if under(rel, sqlHomes) {
				homes++
				return true
			}
			t.Errorf("%s: SQL outside internal/store, activities/ and consumer/: %.60q", fset.Position(lit.Pos()), s)
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if homes < 20 {
		t.Fatalf("only %d SQL statements found in their homes; is the scan still recognising SQL?", homes)
	}
}

func under(rel string, dirs []string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}
