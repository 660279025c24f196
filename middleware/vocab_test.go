package middleware_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestOneNamePerConcept: the package exports nothing deprecated and re-exports
// nothing of another idemkey package (an alias, a constant or variable that is
// another package's, or a function that only calls another package's): one
// concept, one import path.
func TestOneNamePerConcept(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range pkgs["middleware"].Files {
		idemkey := map[string]bool{}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if strings.HasPrefix(path, "github.com/idemkey/idemkey/") {
				idemkey[path[strings.LastIndex(path, "/")+1:]] = true
			}
		}
		foreign := func(e ast.Expr) bool {
			sel, ok := e.(*ast.SelectorExpr)
			if !ok {
				return false
			}
			x, ok := sel.X.(*ast.Ident)
			return ok && idemkey[x.Name]
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Doc != nil && strings.Contains(d.Doc.Text(), "Deprecated:") {
					t.Errorf("%s is deprecated", d.Name)
				}
				if d.Recv == nil && d.Body != nil && len(d.Body.List) == 1 {
					if r, ok := d.Body.List[0].(*ast.ReturnStmt); ok && len(r.Results) == 1 {
						if c, ok := r.Results[0].(*ast.CallExpr); ok && foreign(c.Fun) {
							t.Errorf("%s only calls %s: a re-export", d.Name, qualified(c.Fun))
						}
					}
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() && s.Assign.IsValid() && foreign(s.Type) {
							t.Errorf("type %s is an alias of %s", s.Name, qualified(s.Type))
						}
					case *ast.ValueSpec:
						for i, n := range s.Names {
							if n.IsExported() && i < len(s.Values) && foreign(s.Values[i]) {
								t.Errorf("%s is %s", n, qualified(s.Values[i]))
							}
						}
					}
				}
				if d.Doc != nil && strings.Contains(d.Doc.Text(), "Deprecated:") {
					t.Errorf("a declaration at %s is deprecated", fset.Position(d.Pos()))
				}
			}
		}
	}
}

func qualified(e ast.Expr) string {
	sel := e.(*ast.SelectorExpr)
	return sel.X.(*ast.Ident).Name + "." + sel.Sel.Name
}
