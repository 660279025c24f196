package httpfield

import "testing"

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"Idempotency-Key": true, "X-Idem_Key.v2": true, "a!#$%&'*+-.^_`|~9": true,
		"": false, "Idempotency Key": false, "Key:": false, "K\x00": false, "Ключ": false,
		"a\tb": false, "(key)": false, `"key"`: false, "a/b": false, "a,b": false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}
