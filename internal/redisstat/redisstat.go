// Package redisstat measures the Redis traffic of lockreg's tests, benchmarks
// and demo: what a client sends, and what the server ran.
package redisstat

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook that counts what a client sends for its
// callers: round trips (a pipeline is one) and commands by name. The
// handshake go-redis sends on each new connection (HELLO, CLIENT SETINFO,
// CLIENT MAINT_NOTIFICATIONS)
// is left out: it is a cost per connection, not per operation.
type Counter struct {
	roundTrips atomic.Int64
	mu         sync.Mutex
	byName     map[string]int64
}

// RoundTrips is the number of requests sent so far.
func (c *Counter) RoundTrips() int64 { return c.roundTrips.Load() }

// Commands returns how many commands of each name (lower case) were sent.
func (c *Counter) Commands() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.byName))
	for k, v := range c.byName {
		out[k] = v
	}
	return out
}

func (c *Counter) count(cmds ...redis.Cmder) {
	if isHandshake(cmds) {
		return
	}
	c.roundTrips.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byName == nil {
		c.byName = make(map[string]int64)
	}
	for _, cmd := range cmds {
		c.byName[cmd.Name()]++
	}
}

func isHandshake(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "hello":
		case "client":
			if len(cmd.Args()) < 2 {
				return false
			}
			switch strings.ToLower(fmt.Sprint(cmd.Args()[1])) {
			case "setinfo", "maint_notifications":
			default:
				return false
			}
		default:
			return false
		}
	}
	return true
}

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds...)
		return next(ctx, cmds)
	}
}

// CommandStats returns the server's cumulative calls per command from INFO
// commandstats (lower-case names such as "get", "evalsha"). Commands run
// inside Lua scripts are counted there too.
func CommandStats(ctx context.Context, c redis.UniversalClient) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := make(map[string]int64)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		// cmdstat_get:calls=5,usec=12,...
		name, rest, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			continue
		}
		stats[name] = n
	}
	return stats, nil
}

// CommandMicros returns the server's cumulative time in the named
// commands, in microseconds from INFO commandstats: the time Redis's one
// thread spent running them, without reading and writing the calls. A
// script's time includes the commands it ran, which commandstats also
// counts under their own names.
func CommandMicros(ctx context.Context, c redis.UniversalClient, names ...string) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		// cmdstat_evalsha:calls=5,usec=12,...
		name, rest, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "cmdstat_"), ":calls=")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		_, usec, _ := strings.Cut(rest, ",usec=")
		usec, _, _ = strings.Cut(usec, ",")
		n, err := strconv.ParseInt(usec, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("redisstat: cannot read %q: %w", sc.Text(), err)
		}
		total += n
	}
	return total, nil
}

// Delta returns after-before for every name in after, leaving out zeros.
func Delta(before, after map[string]int64) map[string]int64 {
	d := make(map[string]int64)
	for k, v := range after {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	return d
}
