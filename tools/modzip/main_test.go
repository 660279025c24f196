package main

import (
	"archive/zip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func write(t *testing.T, name, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPublishLeavesNestedModulesOut: the parent's zip holds its own files only, as
// the go command's would; the nested module gets its own entry; list, info and mod
// are what `go mod download` reads.
func TestPublishLeavesNestedModulesOut(t *testing.T) {
	tree, out := t.TempDir(), t.TempDir()
	write(t, filepath.Join(tree, "go.mod"), "module example.com/Top\n\ngo 1.26\n")
	write(t, filepath.Join(tree, "top.go"), "package top\n")
	write(t, filepath.Join(tree, "sub", "go.mod"), "module example.com/Top/sub\n\ngo 1.26\n")
	write(t, filepath.Join(tree, "sub", "sub.go"), "package sub\n")
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, dir := range []string{".", "sub", "."} { // the root twice: listed once
		if _, err := publish(out, filepath.Join(tree, dir), "v0.1.0", at); err != nil {
			t.Fatal(err)
		}
	}
	vdir := filepath.Join(out, "example.com", "!top", "@v") // the directory escapes upper case, the zip names do not
	zr, err := zip.OpenReader(filepath.Join(vdir, "v0.1.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if want := []string{"example.com/Top@v0.1.0/go.mod", "example.com/Top@v0.1.0/top.go"}; !slices.Equal(names, want) {
		t.Errorf("root zip holds %q, want %q", names, want)
	}
	if b, _ := os.ReadFile(filepath.Join(vdir, "list")); string(b) != "v0.1.0\n" {
		t.Errorf("list = %q, want one line v0.1.0", b)
	}
	var info struct{ Version, Time string }
	b, _ := os.ReadFile(filepath.Join(vdir, "v0.1.0.info"))
	if err := json.Unmarshal(b, &info); err != nil || info.Version != "v0.1.0" || info.Time != "2026-12-01T00:00:00Z" {
		t.Errorf("info = %s (%v)", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(vdir, "v0.1.0.mod")); string(b) != "module example.com/Top\n\ngo 1.26\n" {
		t.Errorf("mod = %q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "example.com", "!top", "sub", "@v", "v0.1.0.zip")); err != nil {
		t.Errorf("nested module not published: %v", err)
	}
}

// TestPublishRefusesBadInput: no go.mod, or a version that is not semver, is an
// error naming it, and nothing is written.
func TestPublishRefusesBadInput(t *testing.T) {
	tree, out := t.TempDir(), t.TempDir()
	if _, err := publish(out, tree, "v0.1.0", time.Now()); err == nil {
		t.Error("a directory without go.mod was published")
	}
	write(t, filepath.Join(tree, "go.mod"), "module example.com/m\n")
	if _, err := publish(out, tree, "0.1", time.Now()); err == nil {
		t.Error("version 0.1 was accepted")
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("refused input left %d entries in the proxy directory", len(entries))
	}
}
