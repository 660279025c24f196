// Command modzip publishes modules of a source tree at one version into a directory
// laid out as a module proxy, so GOPROXY=file://DIR serves them as if they were tagged:
// for each module, DIR/<escaped path>/@v/list, <version>.info, <version>.mod and
// <version>.zip. The zip is built as the go command builds one from a tag
// (golang.org/x/mod/zip): files of nested modules and vendor directories are left out,
// and names and sizes are checked against the module zip limits.
//
// Usage:
//
//	modzip -version v0.1.0 -out DIR TREE MODDIR...
//
// TREE is the source tree (for a release simulation, `git archive` of the commit to
// tag); each MODDIR is a module's directory relative to TREE ("." for the root).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "", "the version to publish every module at, e.g. v0.1.0")
	out := flag.String("out", "", "the proxy directory to write")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: modzip -version vX.Y.Z -out DIR TREE MODDIR...")
		os.Exit(2)
	}
	tree := flag.Arg(0)
	for _, dir := range flag.Args()[1:] {
		path, err := publish(*out, filepath.Join(tree, dir), *version, time.Now())
		if err != nil {
			fmt.Fprintf(os.Stderr, "modzip: %s: %v\n", dir, err)
			os.Exit(1)
		}
		fmt.Printf("published %s@%s\n", path, *version)
	}
}

// publish writes the module in dir at version into the proxy directory out and
// returns its module path. An error names what is wrong: no go.mod, no module line,
// an invalid path or version, a file the zip format refuses.
func publish(out, dir, version string, at time.Time) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", errors.New("go.mod has no module line")
	}
	mv := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return "", err
	}
	esc, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	if err := writeZip(filepath.Join(vdir, version+".zip"), mv, dir); err != nil {
		return "", err
	}
	info, _ := json.Marshal(struct{ Version, Time string }{version, at.UTC().Format(time.RFC3339)})
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return "", err
	}
	return path, addToList(filepath.Join(vdir, "list"), version)
}

// writeZip writes the module zip of the module in dir to name.
func writeZip(name string, mv module.Version, dir string) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(f, mv, dir); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// addToList adds version to the proxy's list file (one version a line) unless it
// is there.
func addToList(name, version string) error {
	b, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(b))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
