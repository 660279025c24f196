package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"mime"
	"slices"
	"strings"
	"testing"
)

// oracleMediaType is the media type equivalence written with package mime: the
// parsed type and parameters, charset lower-cased; ok false when mime refuses
// the value.
func oracleMediaType(v string) (string, bool) {
	if v == "" {
		return "", true
	}
	t, params, err := mime.ParseMediaType(v)
	if err != nil {
		return "", false
	}
	if cs, ok := params["charset"]; ok {
		params["charset"] = strings.ToLower(cs)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range params {
			if !yield(k) {
				return
			}
		}
	})
	out := t
	for _, k := range names {
		out += fmt.Sprintf(";%q=%q", k, params[k])
	}
	return out, true
}

// genMediaType builds a Content-Type value from pieces: types, parameters in
// any order, case, spacing and quoting.
func genMediaType(rng *rand.Rand) string {
	types := []string{"application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "Application/JSON", "TEXT/plain"}
	params := []string{"charset=utf-8", "charset=UTF-8", `charset="utf-8"`, "charset=utf-16", "boundary=abc", "boundary=ABC", `boundary="abc"`, `boundary="a;b"`, `boundary="a\"b"`, "Boundary=abc", "q=1", "v=a/b"}
	spaces := []string{"", " ", "  ", "\t"}
	var b strings.Builder
	b.WriteString(spaces[rng.IntN(len(spaces))])
	b.WriteString(types[rng.IntN(len(types))])
	seen := map[string]bool{}
	for range rng.IntN(4) {
		p := params[rng.IntN(len(params))]
		name := strings.ToLower(p[:strings.IndexByte(p, '=')])
		if seen[name] && rng.IntN(4) > 0 {
			continue // duplicates: mime refuses them, keep a few
		}
		seen[name] = true
		b.WriteString(spaces[rng.IntN(len(spaces))] + ";" + spaces[rng.IntN(len(spaces))] + p)
	}
	if rng.IntN(8) == 0 {
		b.WriteString(";")
	}
	return b.String()
}

// TestContentTypeNormalForm: over generated Content-Type values, two requests
// share a fingerprint when package mime reads the same media type (charset
// case-insensitive), and never when it reads different ones; a value mime
// refuses shares a fingerprint only with itself.
func TestContentTypeNormalForm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	vals := []string{""}
	for range 400 {
		vals = append(vals, genMediaType(rng))
	}
	vals = append(vals, "json", "text/", "text/plain; charset", `text/plain; a="x`, "text/plain; a=b c")
	fps := make([][32]byte, len(vals))
	for i, v := range vals {
		fps[i] = sum(t, Request{Method: "POST", Route: "/", Body: []byte("a=1"), ContentType: v}, Options{})
	}
	for i, a := range vals {
		oa, okA := oracleMediaType(a)
		for j, b := range vals[:i] {
			ob, okB := oracleMediaType(b)
			same := fps[i] == fps[j]
			switch {
			case same && okA != okB:
				t.Errorf("%q and %q share a fingerprint, and mime refuses one only", a, b)
			case same && okA && oa != ob:
				t.Errorf("%q and %q share a fingerprint, mime reads %q and %q", a, b, oa, ob)
			case !same && okA && oa == ob && !repeatsParam(a) && !repeatsParam(b):
				// a repeated parameter (which mime takes once when its values
				// agree) is kept twice: another request, never a merge
				t.Errorf("%q and %q: other fingerprints, mime reads %q", a, b, oa)
			}
		}
	}
}

// TestContentTypeInFingerprint: the same bytes sent with another media type
// are another request, under every body mode; version 1 ignores it.
func TestContentTypeInFingerprint(t *testing.T) {
	only := mustRule(t)(OnlyJSONFields("/a"))
	for _, o := range []Options{{}, {CanonicalJSON: true}, {Rule: only}} {
		mk := func(ct string, v int) [32]byte {
			o := o
			o.Version = v
			return sum(t, Request{Method: "POST", Route: "/", Body: []byte(`{"a":1}`), ContentType: ct}, o)
		}
		if mk("text/plain", 0) == mk("application/json", 0) || mk("", 0) == mk("application/json", 0) {
			t.Errorf("%+v: the media type does not count", o)
		}
		if mk("text/plain", 1) != mk("application/json", 1) || mk("", 1) != mk("text/plain", 1) {
			t.Errorf("%+v: version 1 reads the media type", o)
		}
		if mk("application/json", 1) == mk("application/json", 0) {
			t.Errorf("%+v: versions 1 and 2 share a digest", o)
		}
	}
}

func repeatsParam(v string) bool {
	seen := map[string]bool{}
	for _, p := range strings.Split(v, ";")[1:] {
		name, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(p)), "=")
		if name != "" && seen[name] {
			return true
		}
		seen[name] = true
	}
	return false
}
