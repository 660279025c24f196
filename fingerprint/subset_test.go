package fingerprint

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store"
)

func mustRule(t *testing.T) func(*Rule, error) *Rule {
	return func(r *Rule, err error) *Rule {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

func sumBody(t *testing.T, r *Rule, body string) store.Fingerprint {
	t.Helper()
	fp, err := Sum(Request{Method: "POST", Route: "/payments", Body: []byte(body)}, Options{Rule: r})
	if err != nil {
		t.Fatalf("Sum(%s): %v", body, err)
	}
	return fp
}

func TestParsePointer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"/", []string{""}},
		{"/a/0/b", []string{"a", "0", "b"}},
		{"/a~1b", []string{"a/b"}},
		{"/m~0n", []string{"m~n"}},
		{"/~01", []string{"~1"}}, // ~0 first gives "~1", never "/"
		{"/a//b", []string{"a", "", "b"}},
	} {
		got, err := ParsePointer(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParsePointer(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a", "a/b", "/~", "/~2", "/a~", "#/a"} {
		if _, err := ParsePointer(bad); err == nil {
			t.Errorf("ParsePointer(%q): no error", bad)
		}
	}
}

func TestRuleConstructorsRefuse(t *testing.T) {
	body := func(dst, b []byte) ([]byte, error) { return append(dst, b...), nil }
	for name, f := range map[string]func() (*Rule, error){
		"only none":       func() (*Rule, error) { return OnlyJSONFields() },
		"ignore none":     func() (*Rule, error) { return IgnoreJSONFields() },
		"ignore root":     func() (*Rule, error) { return IgnoreJSONFields("/a", "") },
		"only bad":        func() (*Rule, error) { return OnlyJSONFields("/a", "b") },
		"ignore bad":      func() (*Rule, error) { return IgnoreJSONFields("/a~2") },
		"custom empty id": func() (*Rule, error) { return NewRule("", body) },
		"custom nil":      func() (*Rule, error) { return NewRule("x/v1", nil) },
	} {
		if r, err := f(); r != nil || !errors.Is(err, ErrInvalidRule) {
			t.Errorf("%s: %v, %v; want ErrInvalidRule", name, r, err)
		}
	}
	if _, err := Sum(Request{Body: []byte("{}")}, Options{Rule: &Rule{}}); !errors.Is(err, ErrInvalidRule) {
		t.Errorf("zero Rule: %v", err)
	}
}

func TestRuleID(t *testing.T) {
	a := mustRule(t)(OnlyJSONFields("/b", "/a", "/a"))
	b := mustRule(t)(OnlyJSONFields("/a", "/b"))
	if a.ID() != `only-json-fields/v1["/a","/b"]` || a.ID() != b.ID() {
		t.Errorf("IDs %q, %q", a.ID(), b.ID())
	}
	if sumBody(t, a, `{"a":1}`) != sumBody(t, b, `{"a":1}`) {
		t.Error("one path set in another order gave another fingerprint")
	}
	i := mustRule(t)(IgnoreJSONFields("/a"))
	if i.ID() != `ignore-json-fields/v1["/a"]` {
		t.Errorf("ID %q", i.ID())
	}
}

func TestOnlyJSONFields(t *testing.T) {
	r := mustRule(t)(OnlyJSONFields("/amount", "/to", "/items/1/sku", "/a~1b", "/m~0n"))
	base := sumBody(t, r, `{"amount":500,"to":"acc-2","ts":1,"items":[{"sku":"x"},{"sku":"y","n":1}],"a/b":1,"m~n":2}`)
	same := []string{
		// volatile members added, removed or changed; order and whitespace
		`{ "to":"acc-2", "amount":500, "ts":2, "trace":"z", "items":[{"sku":"q"},{"n":9,"sku":"y"}], "m~n":2, "a/b":1 }`,
		`{"amount":500,"to":"acc-2","items":[{},{"sku":"y"}],"a/b":1,"m~n":2}`,
		// escapes in names are decoded before they are compared
		`{"amount":500,"t\u006f":"acc-2","items":[{},{"sku":"y"}],"a/b":1,"m~n":2}`,
	}
	for _, b := range same {
		if sumBody(t, r, b) != base {
			t.Errorf("%s: another fingerprint, want the same", b)
		}
	}
	differ := []string{
		`{"amount":501,"to":"acc-2","items":[{"sku":"x"},{"sku":"y"}],"a/b":1,"m~n":2}`,
		`{"amount":500,"to":"acc-2","items":[{"sku":"x"},{"sku":"z"}],"a/b":1,"m~n":2}`,
		`{"amount":500,"to":"acc-2","items":[{"sku":"y"}],"a/b":1,"m~n":2}`,                // index 1 absent
		`{"amount":500,"to":"acc-2","items":[{"sku":"x"},{"sku":"y"}],"a/b":1}`,            // m~n absent
		`{"amount":500,"to":"acc-2","items":[{"sku":"x"},{"sku":"y"}],"a/b":1,"m~n":null}`, // null is not absent
		`{"amount":500,"to":"acc-2","items":[{"sku":"x"},{"sku":"y"}],"a~1b":1,"m~n":2}`,   // names are not pointers
		`[500,"acc-2"]`,
	}
	for _, b := range differ {
		if sumBody(t, r, b) == base {
			t.Errorf("%s: the same fingerprint, want another", b)
		}
	}
}

func TestOnlyJSONFieldsAbsentAndIndices(t *testing.T) {
	r := mustRule(t)(OnlyJSONFields("/a", "/b"))
	// the value of one path never passes for another's
	if sumBody(t, r, `{"a":1}`) == sumBody(t, r, `{"b":1}`) {
		t.Error(`{"a":1} and {"b":1} share a fingerprint`)
	}
	ix := mustRule(t)(OnlyJSONFields("/01", "/-"))
	// "01" and "-" name no array element, but do name object members
	if sumBody(t, ix, `[1,2]`) != sumBody(t, ix, `[3,4]`) {
		t.Error(`"/01" or "/-" matched an array element`)
	}
	if sumBody(t, ix, `{"01":1}`) == sumBody(t, ix, `{"01":2}`) {
		t.Error(`"/01" did not match the member "01"`)
	}
	whole := mustRule(t)(OnlyJSONFields(""))
	if sumBody(t, whole, `{"b":1, "a":2}`) != sumBody(t, whole, `{"a":2,"b":1}`) ||
		sumBody(t, whole, `{"a":2}`) == sumBody(t, whole, `{"a":3}`) {
		t.Error(`"" is not the whole canonical document`)
	}
}

func TestIgnoreJSONFields(t *testing.T) {
	r := mustRule(t)(IgnoreJSONFields("/ts", "/meta/trace", "/items/0/nonce", "/tags/0"))
	base := sumBody(t, r, `{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":["a","b"]}`)
	for _, b := range []string{
		`{"amount":500,"meta":{"src":"app"},"items":[{"sku":"x"}],"tags":["a","b"]}`,
		`{"tags":["zz","b"],"items":[{"sku":"x","nonce":9}],"meta":{"src":"app","trace":"t2"},"ts":"now","amount":500}`,
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":[{"deep":1},"b"]}`,
	} {
		if sumBody(t, r, b) != base {
			t.Errorf("%s: another fingerprint, want the same", b)
		}
	}
	for _, b := range []string{
		`{"amount":501,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":["a","b"]}`,
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"web"},"items":[{"nonce":1,"sku":"x"}],"tags":["a","b"]}`,
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"},{"nonce":2}],"tags":["a","b"]}`,
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":["b"]}`, // indices keep their place
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":["a","c"]}`,
		`{"amount":500,"ts":1,"meta":{"trace":"t1","src":"app"},"items":[{"nonce":1,"sku":"x"}],"tags":["a","b"],"x":1}`,
	} {
		if sumBody(t, r, b) == base {
			t.Errorf("%s: the same fingerprint, want another", b)
		}
	}
}

func TestRuleNotJSON(t *testing.T) {
	only := mustRule(t)(OnlyJSONFields("/a"))
	ignore := mustRule(t)(IgnoreJSONFields("/a"))
	for _, r := range []*Rule{only, ignore} {
		for _, b := range []string{"", "amount=5", `{"a":1`, `{"a":1} {}`, "\xff"} {
			_, err := Sum(Request{Method: "POST", Body: []byte(b)}, Options{Rule: r})
			var je *JSONError
			if !errors.As(err, &je) || !errors.Is(err, ErrInvalidJSON) {
				t.Errorf("%s on %q: %v, want a *JSONError", r.ID(), b, err)
			}
		}
	}
	custom := mustRule(t)(NewRule("first-line/v1", func(dst, b []byte) ([]byte, error) {
		line, _, ok := strings.Cut(string(b), "\n")
		if !ok {
			return dst, errors.New("no line")
		}
		return append(dst, line...), nil
	}))
	if _, err := Sum(Request{Body: []byte("x")}, Options{Rule: custom}); err == nil || !strings.Contains(err.Error(), "first-line/v1: no line") {
		t.Errorf("custom rule error: %v", err)
	}
	a, err1 := Sum(Request{Body: []byte("x\n1")}, Options{Rule: custom})
	b, err2 := Sum(Request{Body: []byte("x\n2")}, Options{Rule: custom})
	if err1 != nil || err2 != nil || a != b {
		t.Errorf("custom rule: %v %v %v", a == b, err1, err2)
	}
}

func TestRuleIdentityInFingerprint(t *testing.T) {
	body := `{"a":1,"b":2}`
	onlyA := mustRule(t)(OnlyJSONFields("/a"))
	onlyAB := mustRule(t)(OnlyJSONFields("/a", "/b"))
	ignoreB := mustRule(t)(IgnoreJSONFields("/b"))
	plain, _ := Sum(Request{Method: "POST", Route: "/payments", Body: []byte(body)}, Options{})
	canon, _ := Sum(Request{Method: "POST", Route: "/payments", Body: []byte(body)}, Options{CanonicalJSON: true})
	fps := map[store.Fingerprint]string{plain: "none", canon: "canonical"}
	for _, r := range []*Rule{onlyA, onlyAB, ignoreB} {
		fp := sumBody(t, r, body)
		if other, dup := fps[fp]; dup {
			t.Errorf("%s and %s share a fingerprint", r.ID(), other)
		}
		fps[fp] = r.ID()
		if !SameRule(fp, r) || SameRule(fp, nil) {
			t.Errorf("SameRule(%s)", r.ID())
		}
		for _, o := range []*Rule{onlyA, onlyAB, ignoreB} {
			if o != r && SameRule(fp, o) {
				t.Errorf("SameRule(%s's fingerprint, %s) = true", r.ID(), o.ID())
			}
		}
	}
	if !SameRule(plain, nil) || !SameRule(canon, nil) || SameRule(plain, onlyA) {
		t.Error("SameRule on fingerprints without a rule")
	}
}

func TestRuleCoversMethodRouteQueryEncoding(t *testing.T) {
	r := mustRule(t)(OnlyJSONFields("/a"))
	base := Request{Method: "POST", Route: "/p", RawQuery: "x=1&y=2", Body: []byte(`{"a":1}`)}
	fp0, _ := Sum(base, Options{Rule: r})
	reordered := base
	reordered.RawQuery = "y=2&x=1"
	if fp, _ := Sum(reordered, Options{Rule: r}); fp != fp0 {
		t.Error("canonical query not applied under a rule")
	}
	for _, mut := range []func(*Request){
		func(q *Request) { q.Method = "PATCH" },
		func(q *Request) { q.Route = "/q" },
		func(q *Request) { q.RawQuery = "x=2&y=2" },
		func(q *Request) { q.ContentEncoding = "identity" },
	} {
		q := base
		mut(&q)
		if fp, _ := Sum(q, Options{Rule: r}); fp == fp0 {
			t.Errorf("%+v: same fingerprint as %+v", q, base)
		}
	}
}

func TestRuleNeverPanics(t *testing.T) {
	only := mustRule(t)(OnlyJSONFields("/a/0/b", "/c", ""))
	ignore := mustRule(t)(IgnoreJSONFields("/a/0/b", "/c", "/x/1"))
	for _, b := range []string{`"\"a\\"`, `[[[]]]`, `{"a":[{"b":"}]"}]}`, `{"a":"\u005d"}`, `{"c":{"c":[1,{"}":2}]}}`,
		`[1,"]",{"x":[0,1,2]}]`, `{"x":[{"a":1},[2],"3"]}`, `-0.5e+3`, `true`, `null`, `{"a\"b":1}`, strings.Repeat("[", 600)} {
		for _, r := range []*Rule{only, ignore} {
			_, _ = Sum(Request{Body: []byte(b)}, Options{Rule: r})
		}
	}
}

func BenchmarkIgnoreJSONFields(b *testing.B) {
	r, _ := IgnoreJSONFields("/ts", "/meta/trace")
	req := Request{Method: "POST", Route: "/payments",
		Body: []byte(`{"amountCents":500,"to":"acc-2","ts":"2026-12-01T10:00:00Z","meta":{"trace":"abc","src":"app"}}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Sum(req, Options{Rule: r}); err != nil {
			b.Fatal(err)
		}
	}
}

// A custom rule that returns the body itself must never have that slice reused
// as a buffer: the caller's body would be overwritten by the next Sum.
func TestCustomRuleResultNotPooled(t *testing.T) {
	ident := mustRule(t)(NewRule("identity/v1", func(dst, b []byte) ([]byte, error) { return b, nil }))
	body := []byte(`{"a":1}`)
	keep := string(body)
	if _, err := Sum(Request{Body: body}, Options{Rule: ident}); err != nil {
		t.Fatal(err)
	}
	only := mustRule(t)(OnlyJSONFields("/a"))
	for range 10 {
		Sum(Request{Body: []byte(`{"a":"a longer value than the first body"}`)}, Options{Rule: only})
		Sum(Request{Body: []byte(`{"b":2}`)}, Options{CanonicalJSON: true})
	}
	if string(body) != keep {
		t.Fatalf("the caller's body was overwritten: %q", body)
	}
}
