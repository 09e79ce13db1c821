package lockreg

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// batcher sends the acquisition and release calls of concurrent
// goroutines, up to protocol.MaxInFlight at a time, coalescing the rest
// into pipelines (auto-pipelining): one write and one read for many calls,
// on the client and on the server.
type batcher struct {
	client redis.UniversalClient

	mu       sync.Mutex // guards inFlight and queue
	inFlight int
	queue    []*queuedCall
}

// queuedCall is a call waiting for a slot. Its done is closed when its
// Cmd has its reply or when it must lead the queue (batch is then set).
type queuedCall struct {
	call  protocol.Call
	done  chan struct{}
	batch []*queuedCall
}

// run makes c, alone or in a pipeline with other goroutines' calls, and
// returns its reply.
func (b *batcher) run(ctx context.Context, c protocol.Call) *redis.Cmd {
	cmd, _ := b.send(ctx, true, c)
	return cmd
}

// send is run, but unless queue is set, it makes the call only if it can
// go out at once, alone: a queued call waits for the calls before it and
// then for its pipeline, whose context ends with none of its callers'.
// wentOut says whether the call was made.
func (b *batcher) send(ctx context.Context, queue bool, c protocol.Call) (cmd *redis.Cmd, wentOut bool) {
	b.mu.Lock()
	if b.inFlight < protocol.MaxInFlight {
		b.inFlight++
		b.mu.Unlock()
		protocol.Run(ctx, b.client, &c)
		b.next()
		return c.Cmd, true
	}
	if !queue {
		b.mu.Unlock()
		return nil, false
	}
	q := &queuedCall{call: c, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	<-q.done
	if q.batch != nil {
		// The calls were made with their callers' contexts; one caller's
		// cancellation must not fail the others.
		b.pipeline(context.WithoutCancel(ctx), q.batch)
		b.next()
	}
	return q.call.Cmd, true
}

// next hands the slot of a call that returned to the queued calls, whose
// first caller sends them all as one pipeline, or frees it.
func (b *batcher) next() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()
	batch[0].batch = batch
	close(batch[0].done)
}

// pipeline sends batch as one pipeline and wakes every caller but the
// first, which is the one sending.
func (b *batcher) pipeline(ctx context.Context, batch []*queuedCall) {
	calls := make([]*protocol.Call, len(batch))
	for i, q := range batch {
		calls[i] = &q.call
	}
	protocol.RunPipeline(ctx, b.client, calls)
	for _, q := range batch[1:] {
		close(q.done)
	}
}
