package celeriant_test

import (
	"reflect"
	"testing"
)

func assertEqual(t testing.TB, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("mismatch\n got %+v\nwant %+v", got, want)
	}
}
