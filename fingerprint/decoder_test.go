package fingerprint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The tests of this file hold the fingerprint to what encoding/json reads: two
// bodies whose fingerprints are equal must decode alike, into a map (names
// matched exactly, the last duplicate kept) and into a struct (names matched
// case-insensitively with Unicode folding), as far as the rule in force looks.

// nameClasses lists spellings, as sent between quotes, that encoding/json reads
// as one struct field; each class is a name a handler may read.
var nameClasses = [][]string{
	{"amount", "AMOUNT", "Amount", `\u0061mount`, `amoun\u0074`, `\u0041MOUNT`},
	{"to", "TO", "tO", `t\u006f`, `\u0074\u006F`},
	{"k", "K", `\u212a`, "\u212a"}, // the Kelvin sign folds to k
	{"s", "S", `\u017f`, "\u017f"}, // the long s folds to s
	{"sentAt", "SENTAT", `sent\u0041t`, "sentat"},
	{"meta", "META", `m\u0065ta`},
	{"trace", "Trace", `tr\u0061ce`},
	{"src"},
	{`\ud800`, `\udbff`, `\ufffd`, "\ufffd"}, // lone surrogates read as U+FFFD
	{"x\xff", "x\xfe", `x\ufffd`},            // invalid UTF-8 reads as U+FFFD
	{"x"},
}

// gen is a generated JSON value: a scalar (text), an object (members) or an
// array (elems).
type gen struct {
	text    string
	members []genMember
	elems   []gen
	array   bool
}

type genMember struct {
	class, spelling int
	val             gen
}

// genReader draws small numbers from fuzz bytes (0 once they run out).
type genReader struct{ b []byte }

func (r *genReader) n(max int) int {
	if len(r.b) == 0 || max <= 0 {
		return 0
	}
	v := int(r.b[0]) % max
	r.b = r.b[1:]
	return v
}

var scalars = []string{`1`, `2`, `1.0`, `"a"`, `"b"`, `"\u0061"`, `null`, `true`, `false`, `[]`, `{}`}

func (r *genReader) value(depth int) gen {
	switch k := r.n(6); {
	case k == 0 && depth < 3:
		return r.object(depth + 1)
	case k == 1 && depth < 3:
		g := gen{array: true}
		for range r.n(4) {
			g.elems = append(g.elems, r.value(depth+1))
		}
		return g
	default:
		return gen{text: scalars[r.n(len(scalars))]}
	}
}

func (r *genReader) object(depth int) gen {
	var g gen
	for range 1 + r.n(5) {
		c := r.n(len(nameClasses))
		g.members = append(g.members, genMember{class: c, spelling: r.n(len(nameClasses[c])), val: r.value(depth)})
	}
	return g
}

// mutate changes g in place by one step: respell, reorder, duplicate, drop or
// change a member, or go down into one.
func (r *genReader) mutate(g *gen) {
	if g.array {
		if len(g.elems) > 0 {
			r.mutate(&g.elems[r.n(len(g.elems))])
		}
		return
	}
	if len(g.members) == 0 {
		*g = r.value(2)
		return
	}
	i := r.n(len(g.members))
	m := &g.members[i]
	switch r.n(6) {
	case 0:
		m.spelling = r.n(len(nameClasses[m.class]))
	case 1:
		j := r.n(len(g.members))
		g.members[i], g.members[j] = g.members[j], g.members[i]
	case 2:
		d := *m
		d.spelling = r.n(len(nameClasses[d.class]))
		d.val = r.value(2)
		g.members = append(g.members, d)
	case 3:
		g.members = append(g.members[:i], g.members[i+1:]...)
	case 4:
		m.val = r.value(2)
	default:
		r.mutate(&m.val)
	}
}

func (g gen) clone() gen {
	c := g
	c.members = append([]genMember(nil), g.members...)
	for i := range c.members {
		c.members[i].val = c.members[i].val.clone()
	}
	c.elems = append([]gen(nil), g.elems...)
	for i := range c.elems {
		c.elems[i] = c.elems[i].clone()
	}
	return c
}

func (g gen) appendJSON(b []byte) []byte {
	switch {
	case g.array:
		b = append(b, '[')
		for i, e := range g.elems {
			if i > 0 {
				b = append(b, ',')
			}
			b = e.appendJSON(b)
		}
		return append(b, ']')
	case g.members != nil:
		b = append(b, '{')
		for i, m := range g.members {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, nameClasses[m.class][m.spelling]...)
			b = append(b, `":`...)
			b = m.val.appendJSON(b)
		}
		return append(b, '}')
	}
	return append(b, g.text...)
}

// The handlers' structs: what a struct decoder reads under each rule.
type (
	allFields struct {
		Amount, To, K, S, SentAt, X any
		Meta                        *struct{ Trace, Src any }
	}
	// A handler under OnlyJSONFields reads the values at the paths, not
	// whether the objects above them are there: Meta is a value.
	onlyFields struct {
		Amount, To any
		Meta       struct{ Trace any }
	}
	ignoreFields struct {
		Amount, To, K, S, X any
		Meta                *struct{ Src any }
	}
)

var (
	onlyRule   = func() *Rule { r, _ := OnlyJSONFields("/amount", "/to", "/meta/trace"); return r }()
	ignoreRule = func() *Rule { r, _ := IgnoreJSONFields("/sentAt", "/meta/trace"); return r }()
)

// view returns what a handler decoding body with encoding/json reads, as the
// rule in force looks at it: into a map (exact names) and into a struct.
func view(body []byte, o Options) string {
	var m any
	errM := json.Unmarshal(body, &m)
	var s any
	switch o.Rule {
	case nil:
		s = new(allFields)
	case onlyRule:
		s = new(onlyFields)
		mm, _ := m.(map[string]any)
		meta, _ := mm["meta"].(map[string]any)
		m = []any{lookup(mm, "amount"), lookup(mm, "to"), lookup(meta, "trace")}
	case ignoreRule:
		s = new(ignoreFields)
		if mm, ok := m.(map[string]any); ok {
			delete(mm, "sentAt")
			if meta, ok := mm["meta"].(map[string]any); ok {
				delete(meta, "trace")
			}
		}
	}
	errS := json.Unmarshal(body, s)
	out, _ := json.Marshal([]any{errM == nil, m, errS == nil, s})
	return string(out)
}

func lookup(m map[string]any, k string) any {
	if v, ok := m[k]; ok {
		return []any{v}
	}
	return "absent"
}

// fingerprintAs returns the fingerprint the middleware uses for body under o:
// without a rule, a body with no canonical form is fingerprinted by its raw
// bytes; under a rule it is refused (ok false).
func fingerprintAs(t *testing.T, body []byte, o Options) (fp [32]byte, ok bool) {
	req := Request{Method: "POST", Route: "/payments", Body: body}
	f, err := Sum(req, o)
	switch {
	case err == nil:
		return f, true
	case !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrDuplicateName):
		t.Fatalf("Sum(%q): unexpected error %v", body, err)
	case o.Rule != nil:
		return fp, false
	}
	f, err = Sum(req, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f, true
}

// checkPair fails when the bodies generated from seed (one, then a mutation of
// it) share a fingerprint under some rule while encoding/json reads them
// differently under that rule.
func checkPair(t *testing.T, seed []byte) {
	r := &genReader{b: seed}
	a := r.value(0)
	b := a.clone()
	for range 1 + r.n(3) {
		r.mutate(&b)
	}
	ja, jb := a.appendJSON(nil), b.appendJSON(nil)
	for _, o := range []Options{{CanonicalJSON: true}, {Rule: onlyRule}, {Rule: ignoreRule}} {
		fa, okA := fingerprintAs(t, ja, o)
		fb, okB := fingerprintAs(t, jb, o)
		if !okA || !okB || fa != fb {
			continue
		}
		if va, vb := view(ja, o), view(jb, o); va != vb {
			t.Fatalf("one fingerprint under %+v for bodies encoding/json reads differently:\n%q reads %s\n%q reads %s", o, ja, va, jb, vb)
		}
	}
}

// FuzzFingerprintAgreesWithDecoder generates body pairs (a body and a mutation
// of it: names respelled with escapes or another case, members reordered,
// duplicated, dropped or changed) and checks that no pair encoding/json reads
// differently shares a fingerprint, without a rule (CanonicalJSON) and under
// OnlyJSONFields and IgnoreJSONFields.
func FuzzFingerprintAgreesWithDecoder(f *testing.F) {
	for _, s := range []string{"\x00\x01\x00\x00\x05\x00\x00\x00", "\x00\x02\x00\x00\x01\x00\x03\x02\x05", "\x00\x01\x08\x01\x00\x00\x00\x01"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, seed []byte) { checkPair(t, seed) })
}

// TestFingerprintAgreesWithDecoder runs the fuzz target's check over generated
// seeds, so every run of the tests covers the class.
func TestFingerprintAgreesWithDecoder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	seed := make([]byte, 48)
	for range n {
		for i := 0; i < len(seed); i += 8 {
			binary.LittleEndian.PutUint64(seed[i:], rng.Uint64())
		}
		checkPair(t, seed)
	}
}

// TestDuplicateNamesRefused: every pair of spellings of one name in one object
// is a *NameError, in either order and at any depth.
func TestDuplicateNamesRefused(t *testing.T) {
	for _, class := range nameClasses {
		for _, a := range class {
			for _, b := range class {
				for _, body := range []string{
					`{"` + a + `":1,"` + b + `":2}`,
					`{"z":[{"` + a + `":1,"q":0,"` + b + `":2}]}`,
				} {
					_, err := AppendCanonicalJSON(nil, []byte(body))
					var ne *NameError
					if !errors.As(err, &ne) || !errors.Is(err, ErrDuplicateName) {
						t.Errorf("%q: %v, want a *NameError", body, err)
					}
				}
			}
		}
	}
	// many members: the sorted path
	var sb strings.Builder
	sb.WriteString("{")
	for i := range 40 {
		sb.WriteString(`"m` + strconv.Itoa(i) + `":1,`)
	}
	sb.WriteString(`"M7":2}`)
	if _, err := AppendCanonicalJSON(nil, []byte(sb.String())); !errors.Is(err, ErrDuplicateName) {
		t.Errorf("40 members and M7: %v", err)
	}
	if _, err := AppendCanonicalJSON(nil, []byte(strings.Replace(sb.String(), "M7", "M77", 1))); err != nil {
		t.Errorf("41 distinct members: %v", err)
	}
}

// TestOnlyJSONFieldsFoldsCase: a member encoding/json reads into the field a
// path names is covered, whatever its case or escapes.
func TestOnlyJSONFieldsFoldsCase(t *testing.T) {
	for _, class := range nameClasses[:2] {
		path := "/" + class[0]
		r := mustRule(t)(OnlyJSONFields(path))
		for _, sp := range class {
			one := sumBody(t, r, `{"`+sp+`":5,"x":1}`)
			two := sumBody(t, r, `{"`+sp+`":7,"x":1}`)
			if one == two {
				t.Errorf("%s: %q with 5 and 7 share a fingerprint", path, sp)
			}
		}
	}
}

// TestCanonicalJSONAcceptsWhatEncodingJSONAccepts: over generated bodies at
// and around the depth limits, and with invalid UTF-8 at each place of a
// string, a JSON rule reads a body exactly when json.Valid accepts it.
func TestCanonicalJSONAcceptsWhatEncodingJSONAccepts(t *testing.T) {
	var bodies []string
	for _, d := range []int{1, 2, 511, 512, 513, 1000, 9999, 10000, 10001, 12000} {
		bodies = append(bodies,
			strings.Repeat("[", d)+strings.Repeat("]", d),
			strings.Repeat(`{"a":`, d)+"1"+strings.Repeat("}", d),
			strings.Repeat(`[{"a":`, d/2)+"[]"+strings.Repeat("}]", d/2))
	}
	for _, bad := range []string{"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80"} {
		for _, at := range []string{`{"%s":1}`, `{"a":"%s"}`, `["x%sy"]`, `"%s"`} {
			bodies = append(bodies, strings.Replace(at, "%s", bad, 1))
		}
	}
	only := mustRule(t)(OnlyJSONFields("/a"))
	for _, b := range bodies {
		want := json.Valid([]byte(b))
		_, err := AppendCanonicalJSON(nil, []byte(b))
		_, errRule := Sum(Request{Body: []byte(b)}, Options{Rule: only})
		if (err == nil) != want || (errRule == nil) != want {
			t.Errorf("%.40q (%d bytes): json.Valid %v, canonical error %v, rule error %v", b, len(b), want, err, errRule)
		}
	}
}
