package redis

import (
	"context"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// The hot commands print as go-redis prints its own (cmd.String(), which logs
// and tracing hooks show): their arguments' values, not pointers.
func TestCommandsPrintTheirArguments(t *testing.T) {
	ctx := context.Background()
	c := newSetNXGet("idemkey:{1:sk}", 1500)
	c.val = []byte("value")
	got := goredis.NewStringCmd(ctx, c.args[:]...).String()
	if want := "set idemkey:{1:sk} value nx px 1500 get: "; got != want {
		t.Errorf("SET prints %q, want %q", got, want)
	}
	e := newCompleteCmd("idemkey:{1:sk}", []byte("tok"), headStored, []byte("rest"), []byte("body"), 60000, any("idemkey:waits"))
	got = goredis.NewCmd(ctx, e.args[:]...).String()
	want := "evalsha " + completeScript.Hash() + " 1 idemkey:{1:sk} tok " + headStored + " rest body 60000 idemkey:waits"
	if !strings.HasPrefix(got, want) {
		t.Errorf("EVALSHA prints %q, want %q", got, want)
	}
}
