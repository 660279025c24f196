package codesize_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/internal/testenv"
)

// The limits, for code that is not a _test.go file and not generated: a file
// counts its lines, a function or method the lines from its func keyword to its
// closing brace.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

const top = "../.."

// TestCodeSize: no file of library code over maxFileLines lines, no function or
// method over maxFuncLines, in every module go.work lists (examples and benchmarks
// included).
func TestCodeSize(t *testing.T) {
	modules := workspaceModules(t)
	var found []offender
	files := 0
	for _, mod := range modules {
		for _, path := range moduleFiles(t, filepath.Join(top, mod)) {
			files++
			found = append(found, measure(t, top, path)...)
		}
	}
	if len(modules) < 20 || files < 200 {
		t.Fatalf("walked %d modules and %d files; go.work lists the modules: is %s the repository root?", len(modules), files, top)
	}
	for _, o := range found {
		t.Errorf("%s", o)
	}
}

// An offender is a file or a function over its limit.
type offender struct {
	path  string // slash-separated, relative to the repository root
	fn    string // empty for a file
	lines int
}

func (o offender) String() string {
	if o.fn == "" {
		return fmt.Sprintf("%s: %d lines, over %d for a file", o.path, o.lines, maxFileLines)
	}
	return fmt.Sprintf("%s: %s: %d lines, over %d for a function", o.path, o.fn, o.lines, maxFuncLines)
}

// workspaceModules returns the directories of go.work's use directives, relative
// to the repository root.
func workspaceModules(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(top, "go.work"))
	if errors.Is(err, fs.ErrNotExist) && !testenv.CI() {
		t.Skipf("no go.work in %s: not run from the repository (a module cache has none)", top)
	}
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	inUse := false
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case inUse && line == ")":
			inUse = false
		case inUse && line != "":
			dirs = append(dirs, line)
		case line == "use (":
			inUse = true
		case strings.HasPrefix(line, "use "):
			dirs = append(dirs, strings.TrimSpace(strings.TrimPrefix(line, "use ")))
		}
	}
	return dirs
}

// moduleFiles returns the library .go files of the module in root, the way the go
// command sees its packages: without directories it ignores (testdata, vendor,
// names starting with . or _) and without nested modules, which go.work lists on
// their own.
func moduleFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path == root {
				return nil
			}
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// measure returns the file at path and its functions that are over their limits,
// named by their path relative to root; nothing for generated code.
func measure(t *testing.T, root, path string) []offender {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	if ast.IsGenerated(f) {
		return nil
	}
	rel, _ := filepath.Rel(root, path)
	rel = filepath.ToSlash(rel)
	var found []offender
	if n := lineCount(src); n > maxFileLines {
		found = append(found, offender{path: rel, lines: n})
	}
	span := func(from, to token.Pos) int { return fset.Position(to).Line - fset.Position(from).Line + 1 }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Body != nil {
				if lines := span(n.Type.Func, n.Body.Rbrace); lines > maxFuncLines {
					found = append(found, offender{path: rel, fn: funcName(n), lines: lines})
				}
			}
			return false // a literal inside is shorter than its function
		case *ast.FuncLit:
			if lines := span(n.Type.Func, n.Body.Rbrace); lines > maxFuncLines {
				found = append(found, offender{path: rel, fn: fmt.Sprintf("func literal at line %d", fset.Position(n.Pos()).Line), lines: lines})
			}
		}
		return true
	})
	return found
}

// lineCount counts the lines of src as wc -l does, a last line without a newline included.
func lineCount(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// funcName names a function "F" and a method "(T).M" or "(*T).M".
func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	var recv func(ast.Expr) string
	recv = func(e ast.Expr) string {
		switch e := e.(type) {
		case *ast.StarExpr:
			return "*" + recv(e.X)
		case *ast.IndexExpr:
			return recv(e.X)
		case *ast.IndexListExpr:
			return recv(e.X)
		case *ast.Ident:
			return e.Name
		}
		return "?"
	}
	return "(" + recv(d.Recv.List[0].Type) + ")." + d.Name.Name
}

// TestMeasureLimits: measure counts a function from its func keyword to its
// closing brace and a file as wc -l does, and names exactly what is over a limit
// (functions, methods and function literals outside a function), at the limits'
// boundaries; generated code is not counted.
func TestMeasureLimits(t *testing.T) {
	// fn is a function of exactly n lines whose header is head.
	fn := func(head string, n int) string {
		return head + " {\n" + strings.Repeat("\t_ = 0\n", n-2) + "}\n"
	}
	pad := func(src string, lines int) string { // comment lines up to lines in all
		return src + strings.Repeat("//\n", lines-strings.Count(src, "\n"))
	}
	dir := t.TempDir()
	files := map[string]string{
		"at.go": pad("package p\n\ntype T struct{}\n\n"+fn("func f80()", maxFuncLines)+fn("func (T) m80()", maxFuncLines)+
			"var v = "+fn("func()", maxFuncLines), maxFileLines),
		"over.go": pad("package p\n\n"+fn("func f81()", maxFuncLines+1)+fn("func (*T) m81()", maxFuncLines+1)+
			fn("func (g G[K]) generic()", maxFuncLines+1)+"var w = "+fn("func()", maxFuncLines+1), maxFileLines+1),
		"gen.go": pad("// Code generated by hand. DO NOT EDIT.\n\npackage p\n\n"+fn("func huge()", 3*maxFuncLines), 2*maxFileLines),
	}
	var found []string
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, o := range measure(t, dir, path) {
			found = append(found, o.String())
		}
	}
	sort.Strings(found)
	funcAt := 3 + 3*(maxFuncLines+1) // the line of w's literal in over.go
	want := []string{
		fmt.Sprintf("over.go: %d lines, over %d for a file", maxFileLines+1, maxFileLines),
		fmt.Sprintf("over.go: (*T).m81: %d lines, over %d for a function", maxFuncLines+1, maxFuncLines),
		fmt.Sprintf("over.go: (G).generic: %d lines, over %d for a function", maxFuncLines+1, maxFuncLines),
		fmt.Sprintf("over.go: f81: %d lines, over %d for a function", maxFuncLines+1, maxFuncLines),
		fmt.Sprintf("over.go: func literal at line %d: %d lines, over %d for a function", funcAt, maxFuncLines+1, maxFuncLines),
	}
	sort.Strings(want)
	if strings.Join(found, "\n") != strings.Join(want, "\n") {
		t.Errorf("offenders:\n%s\nwant:\n%s", strings.Join(found, "\n"), strings.Join(want, "\n"))
	}
}

// TestModuleFiles: the walk takes a module's library files in every package and
// leaves out tests, the directories the go command ignores and nested modules.
func TestModuleFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{
		"go.mod", "a.go", "a_test.go", "sub/b.go", "sub/deeper/c.go", "notes.txt",
		"testdata/t.go", "vendor/v.go", ".hidden/h.go", "_skip/s.go", "nested/go.mod", "nested/n.go",
	} {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("package p\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, path := range moduleFiles(t, dir) {
		rel, _ := filepath.Rel(dir, path)
		got = append(got, filepath.ToSlash(rel))
	}
	if want := "a.go sub/b.go sub/deeper/c.go"; strings.Join(got, " ") != want {
		t.Errorf("files %q, want %s", got, want)
	}
}
