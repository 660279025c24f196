package readmetest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
)

const top = "../.."

var snippet = regexp.MustCompile("(?s)<!-- snippet: (\\S+) -->\n```go\n(.*?)```\n")

// TestReadmeSnippetsCompile: every snippet of README.md and docs/*.md marked with its
// file is that file byte for byte (the files are compiled and vetted with their
// modules), and every such file appears in one of them.
func TestReadmeSnippetsCompile(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(top, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(top, "README.md")}, pages...)
	shown := map[string]bool{}
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(top, page)
		for _, m := range snippet.FindAllStringSubmatch(string(text), -1) {
			path, body := m[1], m[2]
			shown[path] = true
			file, err := os.ReadFile(filepath.Join(top, path))
			if err != nil {
				t.Errorf("%s: snippet of %s: %v", name, path, err)
				continue
			}
			if string(file) != body {
				t.Errorf("%s: snippet of %s differs from the file; copy the file into the page", name, path)
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(top, "*", "*", "internal", "readme", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(top, "*", "internal", "readme", "main.go"))
	files = append(files, more...)
	more, _ = filepath.Glob(filepath.Join(top, "*", "*", "internal", "quickstart", "main.go"))
	files = append(files, more...)
	if len(files) < 8 {
		t.Fatalf("found %d snippet files, want net/http, chi, echo v4, echo v5, gin, the client, the in-transaction handler and the Postgres program: %v", len(files), files)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(top, f)
		if !shown[filepath.ToSlash(rel)] {
			t.Errorf("%s is not shown in README.md or docs/", rel)
		}
	}
}

// TestOpenAPIFragment: the fragment names the middleware's default headers and
// every problem code it answers.
func TestOpenAPIFragment(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(top, "docs", "openapi-fragment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		"name: " + policy.DefaultKeyHeader, middleware.DefaultReplayedHeader + ":", middleware.DefaultOmittedHeader + ":",
		"Retry-After:", "application/problem+json:", middleware.ProblemTypePrefix,
		"- " + middleware.CodeKeyMissing, "- " + middleware.CodeKeyInvalid, "- " + middleware.CodeBodyUnreadable,
		"- " + middleware.CodeRequestTooLarge, "- " + middleware.CodeInFlight, "- " + middleware.CodeMismatch,
		"- " + middleware.CodeStoreUnavailable, "- " + middleware.CodeBodyNotJSON, "- " + middleware.CodeRuleChanged,
		`"400":`, `"409":`, `"413":`, `"422":`, `"503":`,
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/openapi-fragment.yaml lacks %q", want)
		}
	}
	if strings.Contains(doc, "\t") {
		t.Error("docs/openapi-fragment.yaml has a tab (YAML indents with spaces)")
	}
}
