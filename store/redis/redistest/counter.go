package redistest

import (
	"context"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"
)

// CommandCounter is a go-redis hook that counts the commands sent through a client,
// for tests that assert round trips: install it with (*goredis.Client).AddHook and
// read Count before and after the call under test. A pipeline adds one per command
// it carries. It is safe for concurrent use; the zero value is ready.
type CommandCounter struct{ n atomic.Int64 }

// Count returns the number of commands sent so far.
func (h *CommandCounter) Count() int64 { return h.n.Load() }

// DialHook implements goredis.Hook; dials are not counted.
func (h *CommandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

// ProcessHook implements goredis.Hook: it counts one command.
func (h *CommandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements goredis.Hook: it counts every command of the pipeline.
func (h *CommandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

var _ goredis.Hook = (*CommandCounter)(nil)
