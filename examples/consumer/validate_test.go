package main

import (
	"errors"
	"testing"
)

// TestDecodeAsTheAPI: an instruction is checked as the account API checks a
// request body: amountCents from 1 to 2147483647 (zero, negative and larger
// amounts refused), member names exactly as spelled (another letter case is
// an unknown member), each at most once, no unknown member; every refusal is
// errMalformed, so the message is rejected, never applied.
func TestDecodeAsTheAPI(t *testing.T) {
	body := func(amount string) string {
		return `{"instructionId":"i1","accountId":"a1","amountCents":` + amount + `}`
	}
	refused := map[string]string{
		"null instructionId": `{"instructionId":null,"accountId":"a1","amountCents":5}`,
		"unknown member":     `{"instructionId":"i1","accountId":"a1","amountCents":5,"memo":"x"}`,
		"null body":          `null`,
		"array body":         `[{"instructionId":"i1","accountId":"a1","amountCents":5}]`,
	}
	for _, a := range []string{"0", "-0", "-1", "-5", "-2147483648", "2147483648", "9223372036854775807", "1e3"} {
		refused["amount "+a] = body(a)
	}
	// Each member in another letter case next to the right one, and each
	// repeated (encoding/json alone takes the last value for both).
	for variant, value := range map[string]string{"INSTRUCTIONID": `"i2"`, "instructionid": `"i2"`,
		"AccountId": `"a2"`, "accountID": `"a2"`, "AmountCents": `7`, "amountcents": `7`,
		"instructionId": `"i1"`, "accountId": `"a2"`, "amountCents": `6`} {
		refused["then "+variant] = `{"instructionId":"i1","accountId":"a1","amountCents":5,"` + variant + `":` + value + `}`
	}
	refused["only a case variant of amountCents"] = `{"instructionId":"i1","accountId":"a1","AMOUNTCENTS":5}`
	for name, b := range refused {
		t.Run(name, func(t *testing.T) {
			if in, err := decode([]byte(b), ""); !errors.Is(err, errMalformed) {
				t.Fatalf("decode(%s) = %+v, %v; want errMalformed", b, in, err)
			}
		})
	}
	for _, a := range []string{"1", "2147483647", "500"} {
		if _, err := decode([]byte(body(a)), "i1"); err != nil {
			t.Errorf("amount %s: %v", a, err)
		}
	}
}
