package contenders

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// HandoffFloorName names the hand-off floor in S4's worker processes.
const HandoffFloorName = "hand-off floor"

// floorLocalTurns is how many holds in a row the floor passes between the
// goroutines of one process before it passes the baton on, as many as
// lockreg's default local hand-offs, so that the processes take turns
// alike.
const floorLocalTurns = 16

// handoffFloor is not a lock: it is the least a hand-off between
// processes through Redis can cost, one PUBLISH from the releasing process
// to the next one's subscription, with no script, no lease and no
// attempts. One baton goes round procs processes, each one instance;
// within a process it passes between goroutines as a buffered channel's
// token. S4 measures it beside the contenders, so that their hand-offs can
// be read against what the machine allows under the same load.
type handoffFloor struct {
	client  *redis.Client
	sub     *redis.PubSub
	channel func(proc int) string
	proc    int
	procs   int
	baton   chan struct{}
	waiting atomic.Int64 // goroutines in Acquire
	// turns counts the holds in a row here. Atomic: a baton that comes
	// back through Redis gives the memory model no order between the
	// holders that counted before and after.
	turns  atomic.Int64
	routed sync.WaitGroup
}

// floorBaton is the payload of the floor's one message.
const floorBaton = "baton"

// NewHandoffFloor makes process proc's instance of the floor among procs,
// on channels named after name. Process 0 starts with the baton. hooks go
// on its client before it dials (the hand-off split's Probe.Hook).
func NewHandoffFloor(addr, name string, proc, procs int, hooks ...redis.Hook) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	for _, h := range hooks {
		client.AddHook(h)
	}
	c := &handoffFloor{
		client:  client,
		channel: func(proc int) string { return "bench:floor:" + name + ":" + strconv.Itoa(proc) },
		proc:    proc,
		procs:   procs,
		baton:   make(chan struct{}, 1),
	}
	c.sub = c.client.Subscribe(context.Background(), c.channel(proc))
	if _, err := c.sub.Receive(context.Background()); err != nil {
		return nil, errors.Join(err, c.sub.Close(), c.client.Close())
	}
	if proc == 0 {
		c.baton <- struct{}{}
	}
	c.routed.Go(c.route)
	return c, nil
}

// route takes the baton from the subscription, reading it directly as
// lockreg does, and passes it straight on if nobody here wants it (a
// process that finished its run).
func (c *handoffFloor) route() {
	for {
		if _, err := c.sub.ReceiveMessage(context.Background()); err != nil {
			return // closed
		}
		if c.waiting.Load() == 0 {
			_ = c.passOn(context.Background())
			continue
		}
		c.baton <- struct{}{}
	}
}

func (c *handoffFloor) Acquire(ctx context.Context, _ string) (func(context.Context) error, error) {
	c.waiting.Add(1)
	defer c.waiting.Add(-1)
	select {
	case <-c.baton:
		return c.release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *handoffFloor) release(ctx context.Context) error {
	if c.turns.Add(1) < floorLocalTurns && c.waiting.Load() > 0 {
		c.baton <- struct{}{}
		return nil
	}
	c.turns.Store(0)
	return c.passOn(ctx)
}

// passOn publishes the baton to the next process that still listens, or
// keeps it here if none does.
func (c *handoffFloor) passOn(ctx context.Context) error {
	for i := 1; i < c.procs; i++ {
		heard, err := c.client.Publish(ctx, c.channel((c.proc+i)%c.procs), floorBaton).Result()
		if err != nil || heard > 0 {
			return err
		}
	}
	c.baton <- struct{}{}
	return nil
}

func (c *handoffFloor) Reentrant() bool { return false }

func (c *handoffFloor) Close() error {
	err := c.sub.Close()
	c.routed.Wait()
	return errors.Join(err, c.client.Close())
}
