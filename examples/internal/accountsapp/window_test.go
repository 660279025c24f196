package accountsapp

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/examples/accounts"
)

func TestIndexWindow(t *testing.T) {
	for retention, want := range map[time.Duration]time.Duration{
		24 * time.Hour:  24 * time.Hour,
		2 * time.Second: accounts.DefaultWindow,
		0:               accounts.DefaultWindow,
	} {
		if got := indexWindow(retention); got != want {
			t.Errorf("indexWindow(%v) = %v, want %v", retention, got, want)
		}
	}
}
