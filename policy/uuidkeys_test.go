package policy

import (
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
)

// Over generated UUIDs: the lower-case spelling is accepted, every spelling
// with an upper-case hex digit is refused with the upper-case error, so one
// UUID is one key.
func TestUUIDKeysOneSpellingPerUUID(t *testing.T) {
	for i := range 500 {
		var u [16]byte
		rand.Read(u[:])
		lower := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
		if err := UUIDKeys(lower); err != nil {
			t.Fatalf("%s: %v", lower, err)
		}
		mixed := upperSome(lower, uint64(i)*0x9e3779b97f4a7c15|1)
		if mixed == lower { // no letter at all: every digit
			continue
		}
		if err := UUIDKeys(mixed); err != errUpperUUID {
			t.Fatalf("%s: %v, want the upper-case refusal", mixed, err)
		}
		if err := UUIDKeys(strings.ToUpper(lower)); err != errUpperUUID {
			t.Fatalf("%s: %v", strings.ToUpper(lower), err)
		}
	}
}

// upperSome upper-cases the hex letters of s that mask selects.
func upperSome(s string, mask uint64) string {
	var b strings.Builder
	letters := 0
	for _, c := range s {
		if 'a' <= c && c <= 'f' {
			if mask>>(letters%64)&1 == 1 {
				c -= 'a' - 'A'
			}
			letters++
		}
		b.WriteRune(c)
	}
	return b.String()
}

func TestUUIDKeys(t *testing.T) {
	for _, ok := range []string{"8e03978e-40d5-43e8-bc93-6894a57f9324", "00000000-0000-0000-0000-000000000000", "abcdefab-cdef-abcd-efab-cdefabcdefab"} {
		if err := UUIDKeys(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "8e03978e40d543e8bc936894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f932", "8e03978e-40d5-43e8-bc93-6894a57f93245",
		"{8e03978e-40d5-43e8-bc93-6894a57f9324}", "8e03978e-40d5-43e8-bc93_6894a57f9324", "8e03978g-40d5-43e8-bc93-6894a57f9324", "urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
		"ABCDEFAB-CDEF-ABCD-EFAB-CDEFABCDEFAB"} {
		if err := UUIDKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
