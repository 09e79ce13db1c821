package redistest

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestHookWrapsTheCallsOfItsFields: each function of a Hook sees the
// client's calls of its kind, and passes them on.
func TestHookWrapsTheCallsOfItsFields(t *testing.T) {
	ctx := context.Background()
	var (
		mu        sync.Mutex
		dials     int
		commands  []string
		pipelines [][]string
	)
	names := func(cmds []redis.Cmder) []string {
		var n []string
		for _, cmd := range cmds {
			n = append(n, cmd.Name())
		}
		return n
	}
	client := Shared(t).Client(t, Hook{
		Dial: func(next redis.DialHook) redis.DialHook {
			return func(ctx context.Context, network, addr string) (net.Conn, error) {
				mu.Lock()
				dials++
				mu.Unlock()
				return next(ctx, network, addr)
			}
		},
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				mu.Lock()
				commands = append(commands, cmd.Name())
				mu.Unlock()
				return next(ctx, cmd)
			}
		},
		ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
			return func(ctx context.Context, cmds []redis.Cmder) error {
				mu.Lock()
				pipelines = append(pipelines, names(cmds))
				mu.Unlock()
				return next(ctx, cmds)
			}
		},
	})

	require.Equal(t, "hi", client.Echo(ctx, "hi").Val(), "the command went through")
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Echo(ctx, "a")
		p.Echo(ctx, "b")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "b", cmds[1].(*redis.StringCmd).Val(), "the pipeline went through")

	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, dials, "the connection's dial")
	// The connection's handshake (HELLO, CLIENT) goes through the hook too.
	echoes := slices.DeleteFunc(slices.Clone(commands), func(name string) bool { return name != "echo" })
	require.Len(t, echoes, 1, "the command, once: %v", commands)
	require.Contains(t, pipelines, []string{"echo", "echo"})
}

// TestAHookPassesThroughWhatItHasNoFieldFor: a nil field hands back the
// next hook, which the client then calls as if there were no Hook.
func TestAHookPassesThroughWhatItHasNoFieldFor(t *testing.T) {
	ctx := context.Background()
	var h Hook
	var dialed, processed, pipelined bool
	_, _ = h.DialHook(func(context.Context, string, string) (net.Conn, error) { dialed = true; return nil, nil })(ctx, "tcp", "")
	_ = h.ProcessHook(func(context.Context, redis.Cmder) error { processed = true; return nil })(ctx, nil)
	_ = h.ProcessPipelineHook(func(context.Context, []redis.Cmder) error { pipelined = true; return nil })(ctx, nil)
	require.True(t, dialed)
	require.True(t, processed)
	require.True(t, pipelined)

	client := Shared(t).Client(t, Hook{})
	require.Equal(t, "hi", client.Echo(ctx, "hi").Val())
	_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Ping(ctx)
		return nil
	})
	require.NoError(t, err)
}

// TestAfterReplySeesEachCommandWithItsReply: AfterReply's function gets
// every command, single or pipelined, once its reply came.
func TestAfterReplySeesEachCommandWithItsReply(t *testing.T) {
	ctx := context.Background()
	var (
		mu      sync.Mutex
		replies []string
	)
	client := Shared(t).Client(t, AfterReply(func(cmd redis.Cmder) {
		if c, ok := cmd.(*redis.StatusCmd); ok && cmd.Name() == "ping" {
			mu.Lock()
			replies = append(replies, c.Val())
			mu.Unlock()
		}
	}))
	require.NoError(t, client.Ping(ctx).Err())
	_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Echo(ctx, "x")
		p.Ping(ctx)
		p.Ping(ctx)
		return nil
	})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"PONG", "PONG", "PONG"}, replies)
}
