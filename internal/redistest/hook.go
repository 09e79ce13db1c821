package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Hook is a go-redis hook made of functions, for tests that wrap a
// client's calls: Dial wraps its dials, Process its single commands and
// ProcessPipeline its pipelines (and transactions). Each gets the next
// hook of its kind and returns the one to call instead; a nil field
// passes its calls through untouched. A Hook holds no state of its own:
// the functions close over what the test records.
//
//	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
//		return func(ctx context.Context, cmd redis.Cmder) error {
//			seen.Add(1)
//			return next(ctx, cmd)
//		}
//	}})
type Hook struct {
	Dial            func(next redis.DialHook) redis.DialHook
	Process         func(next redis.ProcessHook) redis.ProcessHook
	ProcessPipeline func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook
}

var _ redis.Hook = Hook{}

// DialHook implements redis.Hook.
func (h Hook) DialHook(next redis.DialHook) redis.DialHook {
	if h.Dial == nil {
		return next
	}
	return h.Dial(next)
}

// ProcessHook implements redis.Hook.
func (h Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	if h.Process == nil {
		return next
	}
	return h.Process(next)
}

// ProcessPipelineHook implements redis.Hook.
func (h Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if h.ProcessPipeline == nil {
		return next
	}
	return h.ProcessPipeline(next)
}

// AfterReply is a Hook that calls f with each command once its reply came
// (or its call failed), single or in a pipeline, before its caller sees
// it: for tests that watch replies, or hold one back.
func AfterReply(f func(cmd redis.Cmder)) Hook {
	return Hook{
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				err := next(ctx, cmd)
				f(cmd)
				return err
			}
		},
		ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
			return func(ctx context.Context, cmds []redis.Cmder) error {
				err := next(ctx, cmds)
				for _, cmd := range cmds {
					f(cmd)
				}
				return err
			}
		},
	}
}
