package lockreg

import (
	"context"
	"slices"
	"sync"
	"time"

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

// queuedCall is a call waiting for a slot, with its caller's ctx. Its
// done is closed when its Cmd has its reply or when it must lead the queue
// (batch is then set).
type queuedCall struct {
	ctx   context.Context
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
// go out at once, alone: a queued call waits for the calls before it,
// unless its ctx ends first (the call then fails with ctx's error), and
// then for its pipeline (see pipeline). wentOut says whether the call was
// made, or failed so.
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
	q := &queuedCall{ctx: ctx, call: c, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		// Taken out of the queue, the call is not made; once in a
		// pipeline, it goes out with the others.
		b.mu.Lock()
		i := slices.Index(b.queue, q)
		if i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		if i >= 0 {
			return protocol.Failed(ctx, ctx.Err()), true
		}
		<-q.done
	}
	if q.batch != nil {
		b.pipeline(q.batch)
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
// first, which is the one sending. One caller's cancellation must not fail
// the others' calls, so the pipeline's context is cancelled by none of
// theirs; it has a deadline, the latest of theirs, if all have one, which
// a client that honours contexts (ContextTimeoutEnabled) applies.
func (b *batcher) pipeline(batch []*queuedCall) {
	calls := make([]*protocol.Call, len(batch))
	var latest time.Time
	allEnd := true
	for i, q := range batch {
		calls[i] = &q.call
		deadline, ok := q.ctx.Deadline()
		allEnd = allEnd && ok
		if deadline.After(latest) {
			latest = deadline
		}
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	if allEnd {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	protocol.RunPipeline(ctx, b.client, calls)
	for _, q := range batch[1:] {
		close(q.done)
	}
}
