package redis

import (
	"context"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// The commands of the hot paths (a claim, a replay, a completion) are built
// here rather than through go-redis's typed helpers, which box every argument
// into an interface (one allocation each) and grow the argument slice as they
// go. Each command below is one allocation holding its arguments: the key is
// boxed as a string (go-redis routes on it in a Cluster), constants box
// without allocating, and the other arguments are pointers to the command's
// own fields (a pointer boxes without allocating) of types that go-redis
// writes through encoding.BinaryMarshaler and prints (cmd.String(), in logs
// and traces) through fmt.Stringer.

// bytesArg is a []byte argument.
type bytesArg []byte

// MarshalBinary returns the bytes as they are (go-redis writes them verbatim).
func (a *bytesArg) MarshalBinary() ([]byte, error) { return *a, nil }

func (a *bytesArg) String() string { return string(*a) }

// intArg is an integer argument, written in decimal.
type intArg struct {
	v   int64
	buf [20]byte
}

// MarshalBinary returns v in decimal, in the argument's own buffer.
func (a *intArg) MarshalBinary() ([]byte, error) { return strconv.AppendInt(a.buf[:0], a.v, 10), nil }

func (a *intArg) String() string { return strconv.FormatInt(a.v, 10) }

// setNXGet holds the arguments of SET key value NX PX ms GET: the claim (its
// value a marker in marker) and Fill.
type setNXGet struct {
	cmd    goredis.StringCmd // in the same allocation (run)
	args   [7]any
	px     intArg
	val    bytesArg
	marker [markerLen]byte
}

// newSetNXGet returns the command for key with a TTL of px ms (> 0, at most
// maxTTL); its value is marker until val is set.
func newSetNXGet(key string, px int64) *setNXGet {
	c := &setNXGet{px: intArg{v: px}}
	c.val = c.marker[:]
	c.args = [...]any{"set", key, &c.val, "nx", "px", &c.px, "get"}
	return c
}

// run sends the command: the value that was under the key, or goredis.Nil
// when there was none (the SET wrote val).
func (c *setNXGet) run(ctx context.Context, client goredis.UniversalClient) (string, error) {
	c.cmd = *goredis.NewStringCmd(ctx, c.args[:]...) // inlined: no allocation of its own
	c.cmd.SetFirstKeyPos(1)
	_ = client.Process(ctx, &c.cmd)
	return c.cmd.Result()
}

// completeHash is completeScript's SHA1, boxed once.
var completeHash any = completeScript.Hash()

// completeCmd holds the arguments of completeScript's EVALSHA (scripts.go):
// KEYS[1] key; ARGV token, head, rest, body, ms, channel.
type completeCmd struct {
	args            [10]any
	tok, rest, body bytesArg
	ms              intArg
}

// newCompleteCmd returns the command; head is headStored or headOmitted and
// channel the Store's boxed channel.
func newCompleteCmd(key string, tok []byte, head string, rest, body []byte, ms int64, channel any) *completeCmd {
	c := &completeCmd{tok: tok, rest: rest, body: body, ms: intArg{v: ms}}
	var h any = headStored // a constant boxes without allocating
	if head == headOmitted {
		h = headOmitted
	}
	c.args = [...]any{"evalsha", completeHash, 1, key, &c.tok, h, &c.rest, &c.body, &c.ms, channel}
	return c
}

// run sends EVALSHA and, when Redis does not have the script (NOSCRIPT: a
// restarted or failed-over server), EVAL with its source, as Script.Run does.
func (c *completeCmd) run(ctx context.Context, client goredis.UniversalClient) (any, error) {
	cmd := goredis.NewCmd(ctx, c.args[:]...)
	cmd.SetFirstKeyPos(3)
	_ = client.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && isNoScript(err) {
		key, _ := c.args[3].(string)
		return completeScript.Eval(ctx, client, []string{key}, c.args[4:]...).Result()
	}
	return cmd.Result()
}

// isNoScript reports whether err is Redis's NOSCRIPT (the script's SHA1 is not
// loaded), as go-redis's Script.Run tells it.
func isNoScript(err error) bool {
	return err == goredis.ErrNoScript || strings.HasPrefix(err.Error(), "NOSCRIPT")
}
