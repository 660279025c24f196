// Package errprefix holds the test that keeps one convention for the error
// strings of every library package: "idemkey/<import path below the module>: ".
package errprefix

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

// skippedTop are the trees of programs, benchmarks and tools (their messages are
// log lines for an operator) and celeriant, the client of another product
// whose errors say "celeriant: ".
var skippedTop = map[string]bool{"examples": true, "benchmarks": true, "cmd": true, "tools": true, "celeriant": true}

// prefix matches a message that starts by naming where it comes from.
var prefix = regexp.MustCompile(`^[a-z][a-z0-9_./-]*: `)

// TestErrorPrefix: a string literal given to errors.New or fmt.Errorf in a
// library package's non-test files that starts with a prefix ("name: ", or
// "%w: name: ") starts with "idemkey/<dir>: ", dir being the package's directory below the
// repository root, its import path below the module. Internal packages and test
// helpers (packages named *test) are skipped: their messages are wrapped by the
// caller or read in a test's failure.
func TestErrorPrefix(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "internal" ||
				strings.HasSuffix(name, "test") || !strings.Contains(rel, "/") && skippedTop[name]) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil || f.Name.Name == "main" {
			return err
		}
		want := "idemkey/" + filepath.ToSlash(filepath.Dir(rel)) + ": "
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || !isErrorCall(call.Fun) {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			checked++
			s = strings.TrimPrefix(s, "%w: ") // a sentinel first: the prefix follows it
			if prefix.MatchString(s) && !strings.HasPrefix(s, want) {
				t.Errorf("%s: %q: want the prefix %q", fset.Position(lit.Pos()), s, want)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 200 {
		t.Fatalf("checked %d error strings: the walk missed the repository", checked)
	}
}

// isErrorCall reports whether fun is errors.New or fmt.Errorf.
func isErrorCall(fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && (pkg.Name == "errors" && sel.Sel.Name == "New" || pkg.Name == "fmt" && sel.Sel.Name == "Errorf")
}
