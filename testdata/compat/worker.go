// Command worker takes turns on a few keys with one lockreg registry and
// checks, in Redis, that no two holders overlap, that fencing tokens rise
// and that no increment is lost. compat_test.go builds it twice, against
// the previous release of lockreg and against this tree, and runs one of
// each on the same keys: a rolling deploy in miniature. It uses only the
// API both versions have.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
)

// raise stores a key's token if it is above the last one stored, and
// answers 1; else 0: a token that fails to rise.
var raise = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

type result struct {
	Acquisitions, Overlaps, StaleTokens, Errors, Grants, LocalHandoffs int64
	FirstError                                                         string
}

func main() {
	addr := flag.String("redis", "", "the Redis address")
	namespace := flag.String("namespace", "compat", "the registryKey")
	keys := flag.String("keys", "a,b", "the keys to take turns on")
	d := flag.Duration("d", 5*time.Second, "how long")
	g := flag.Int("g", 4, "goroutines")
	flag.Parse()
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	reg, err := lockreg.New(client, *namespace, lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var res result
	var firstErr sync.Once
	var acquisitions, overlaps, stale, errs atomic.Int64
	fail := func(err error) {
		errs.Add(1)
		firstErr.Do(func() { res.FirstError = err.Error() })
	}
	names := strings.Split(*keys, ",")
	until := time.Now().Add(*d)
	var wg sync.WaitGroup
	for range *g {
		wg.Go(func() {
			for time.Now().Before(until) {
				key := names[rand.IntN(len(names))]
				lock := reg.Obtain(key)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := lock.LockContext(ctx); err != nil {
					cancel()
					fail(err)
					continue
				}
				if inside := client.Incr(ctx, "compat:inside:"+key).Val(); inside != 1 {
					overlaps.Add(1)
				}
				token, err := lock.Token(ctx)
				if err != nil {
					fail(err)
				} else if raised, err := raise.Run(ctx, client, []string{"compat:token:" + key}, token).Int(); err != nil || raised != 1 {
					stale.Add(1)
				}
				n, _ := client.Get(ctx, "compat:count:"+key).Int64()
				time.Sleep(time.Millisecond)
				client.Set(ctx, "compat:count:"+key, n+1, 0)
				client.Decr(ctx, "compat:inside:"+key)
				if err := lock.UnlockContext(ctx); err != nil {
					fail(err)
				}
				acquisitions.Add(1)
				cancel()
			}
		})
	}
	wg.Wait()
	stats := reg.Stats()
	_ = reg.Close()
	res.Acquisitions, res.Overlaps, res.StaleTokens, res.Errors = acquisitions.Load(), overlaps.Load(), stale.Load(), errs.Load()
	res.Grants, res.LocalHandoffs = stats.Grants, stats.LocalHandoffs
	_ = json.NewEncoder(os.Stdout).Encode(res)
}
