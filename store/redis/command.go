package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// The commands of the hot paths (a claim, a replay, a completion) are built
// here rather than through go-redis's typed helpers, which box every argument
// into an interface (one allocation each) and grow the argument slice as they
// go. Each command below is one allocation holding its arguments, boxed as
// pointers to its own fields (go-redis writes *string, *int64 and
// encoding.BinaryMarshaler as it writes their values, and a pointer boxes
// without allocating), plus go-redis's command that reads the reply.

// bytesArg is a []byte argument that boxes without allocating (as a pointer).
type bytesArg []byte

// MarshalBinary returns the bytes as they are (go-redis writes them verbatim).
func (a *bytesArg) MarshalBinary() ([]byte, error) { return *a, nil }

// setNXGet holds the arguments of SET key value NX PX ms GET: the claim (its
// value a marker in marker) and Fill.
type setNXGet struct {
	args   [7]any
	key    string
	px     int64
	val    bytesArg
	marker [markerLen]byte
}

// newSetNXGet returns the command for key with a TTL of px ms (> 0, at most
// maxTTL); its value is marker until val is set.
func newSetNXGet(key string, px int64) *setNXGet {
	c := &setNXGet{key: key, px: px}
	c.val = c.marker[:]
	c.args = [...]any{"set", &c.key, &c.val, "nx", "px", &c.px, "get"}
	return c
}

// run sends the command: the value that was under the key, or goredis.Nil
// when there was none (the SET wrote val).
func (c *setNXGet) run(ctx context.Context, client goredis.UniversalClient) (string, error) {
	cmd := goredis.NewStringCmd(ctx, c.args[:]...)
	cmd.SetFirstKeyPos(1)
	_ = client.Process(ctx, cmd)
	return cmd.Result()
}

// completeHash is completeScript's SHA1, so that a pointer to it
// boxes without allocating.
var (
	completeHash = completeScript.Hash()
)

// completeCmd holds the arguments of completeScript's EVALSHA (scripts.go):
// KEYS[1] key; ARGV token, head, rest, body, ms, channel.
type completeCmd struct {
	args               [10]any
	key, head, channel string
	tok, rest, body    bytesArg
	ms                 int64
}

func newCompleteCmd(key string, tok []byte, head string, rest, body []byte, ms int64, channel string) *completeCmd {
	c := &completeCmd{key: key, head: head, channel: channel, tok: tok, rest: rest, body: body, ms: ms}
	c.args = [...]any{"evalsha", &completeHash, 1, &c.key, &c.tok, &c.head, &c.rest, &c.body, &c.ms, &c.channel}
	return c
}

// run sends EVALSHA and, when Redis does not have the script (NOSCRIPT: a
// restarted or failed-over server), EVAL with its source, as Script.Run does.
func (c *completeCmd) run(ctx context.Context, client goredis.UniversalClient) (any, error) {
	cmd := goredis.NewCmd(ctx, c.args[:]...)
	cmd.SetFirstKeyPos(3)
	_ = client.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && isNoScript(err) {
		return completeScript.Eval(ctx, client, []string{c.key}, c.args[4:]...).Result()
	}
	return cmd.Result()
}

// isNoScript reports whether err is Redis's NOSCRIPT (the script's SHA1 is not
// loaded), as go-redis's Script.Run tells it.
func isNoScript(err error) bool {
	return err == goredis.ErrNoScript || strings.HasPrefix(err.Error(), "NOSCRIPT")
}
