package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// redeliverHook sends every script call and SET twice and keeps the second reply: what a
// go-redis retry does when the first reply was lost (a read timeout or a dropped
// connection after the server ran the script).
type redeliverHook struct{}

func (redeliverHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (redeliverHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" || n == "set" {
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}
func (redeliverHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestClientRetriesAreIdempotent: a Claim or Complete whose reply was lost and that
// the client sent again answers as the first delivery did. A second, deliberate
// Complete is still refused.
func TestClientRetriesAreIdempotent(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(redeliverHook{})
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, shared)))
	id := store.ID{Scope: "tenant", Key: "k"}

	res, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("re-delivered Claim: %+v, %v; want claimed", res, err)
	}
	if err := s.Renew(ctx, id, res.Token, time.Second); err != nil {
		t.Fatalf("re-delivered Renew: %v", err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 201, Body: []byte("x")}, time.Minute); err != nil {
		t.Fatalf("re-delivered Complete: %v; want stored (the first delivery stored it)", err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 500}, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second Complete: %v; want ErrLeaseLost", err)
	}
	rep, err := s.Claim(ctx, claimReq(id, fpA))
	if err != nil || rep.Outcome != store.Completed || rep.Record.Status != 201 || string(rep.Record.Body) != "x" {
		t.Fatalf("replay: %+v, %v; want the first response", rep, err)
	}
}
