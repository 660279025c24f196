package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"slices"
)

// MaxAmountCents is the largest amountCents the API takes (the int32 of the
// reference's events); the smallest is 1.
const MaxAmountCents = 1<<31 - 1

// Field is one member a JSON object may carry: its name, compared exactly (letter
// case included), and a pointer to where its value is decoded.
type Field struct {
	Name string
	Dst  any
}

// Errors of DecodeObject that are about the object's members, not its syntax.
var (
	ErrUnknownField  = errors.New("unknown field")
	ErrRepeatedField = errors.New("repeated field")
	ErrNotOneObject  = errors.New("not exactly one JSON object")
)

// DecodeObject reads exactly one JSON object from dec into fields (at most 8) and
// checks that nothing but whitespace follows it. Member names are compared
// exactly and each may appear once: encoding/json alone would match names in
// any letter case and take {"amountCents":100,"AMOUNTCENTS":3} as 3. A member
// that is not among fields is ErrUnknownField, one seen before ErrRepeatedField,
// anything but one object ErrNotOneObject; a value of the wrong type is a
// *json.UnmarshalTypeError, broken syntax the decoder's error. name is the
// member an error is about ("" for the object as a whole). Absent members leave
// their Dst untouched.
func DecodeObject(dec *json.Decoder, fields []Field) (name string, err error) {
	t, err := dec.Token()
	if err != nil {
		return "", err
	}
	if t != json.Delim('{') {
		return "", ErrNotOneObject
	}
	var seen uint8
	for dec.More() {
		if t, err = dec.Token(); err != nil {
			return "", err
		}
		name, _ = t.(string)
		i := slices.IndexFunc(fields, func(f Field) bool { return f.Name == name })
		switch {
		case i < 0:
			return name, ErrUnknownField
		case seen&(1<<i) != 0:
			return name, ErrRepeatedField
		}
		seen |= 1 << i
		if err := dec.Decode(fields[i].Dst); err != nil {
			return name, err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return "", err
	}
	switch _, err := dec.Token(); {
	case err == nil:
		return "", ErrNotOneObject
	case !errors.Is(err, io.EOF):
		return "", err
	}
	return "", nil
}
