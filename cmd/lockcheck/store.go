//go:build linux

package main

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The fenced store: one hash per lock key on a Redis that is never faulted,
// holding the counter (value), the highest fencing token seen by any read or
// write (max), and the store's own tally of accepted increments and
// rejected operations. Reads and writes are separate calls, as in a real
// read-modify-write, so without fencing a stale holder's write would
// overwrite a newer holder's increment.
//
// Tokens are microseconds since 1970 (about 2^51), exact in Lua's doubles.
var (
	fencedRead = redis.NewScript(`
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
if tonumber(ARGV[1]) < max then
  redis.call('HINCRBY', KEYS[1], 'rejected_reads', 1)
  return -1
end
redis.call('HSET', KEYS[1], 'max', ARGV[1])
return tonumber(redis.call('HGET', KEYS[1], 'value') or '0')
`)
	fencedWrite = redis.NewScript(`
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
if tonumber(ARGV[1]) < max then
  redis.call('HINCRBY', KEYS[1], 'rejected_writes', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'max', ARGV[1], 'value', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return 1
`)
)

// outcome is what the store answered to one read or write.
type outcome int8

const (
	storeNotTried outcome = iota
	storeAccepted
	storeRejected // a higher token had been seen
	storeFailed   // the call failed: it may or may not have run
)

// storeRead returns the record's value if token is not stale.
func storeRead(ctx context.Context, c *redis.Client, record string, token int64) (value int64, outcome outcome) {
	v, err := fencedRead.Run(ctx, c, []string{record}, strconv.FormatInt(token, 10)).Int64()
	switch {
	case err != nil:
		return 0, storeFailed
	case v < 0:
		return 0, storeRejected
	}
	return v, storeAccepted
}

func storeWrite(ctx context.Context, c *redis.Client, record string, token, value int64) outcome {
	ok, err := fencedWrite.Run(ctx, c, []string{record}, strconv.FormatInt(token, 10), value).Int64()
	switch {
	case err != nil:
		return storeFailed
	case ok == 0:
		return storeRejected
	}
	return storeAccepted
}

// recordState is a store record's final state. Its fields stay exported
// for go-redis's Scan.
type recordState struct {
	Value          int64 `json:"value" redis:"value"`
	Accepted       int64 `json:"accepted" redis:"accepted"`
	RejectedReads  int64 `json:"rejected_reads" redis:"rejected_reads"`
	RejectedWrites int64 `json:"rejected_writes" redis:"rejected_writes"`
}

func readRecord(ctx context.Context, c *redis.Client, record string) (recordState, error) {
	var r recordState
	err := c.HMGet(ctx, record, "value", "accepted", "rejected_reads", "rejected_writes").Scan(&r)
	return r, err
}
