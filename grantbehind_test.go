package lockreg

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// A grant behind a hold's back: the key went through another registry
// while the hold believed it held it, and came back by that registry's
// grant. Whenever it lands, the hold must learn that it is lost.

// TestAGrantDuringALocalHandoffLosesTheHold: a grant of a key whose hold
// is being handed off locally (the key went through another registry
// behind the hold's back, whose release granted it back) lands in the
// instant between the two holds, when the key's local state has no
// current hold. Kept as if for a waiter, it hides the ABA from the hold
// that receives the hand-off, as it would from a holder (see
// TestAHoldThatPredatesAGrantOfItsKeyIsLost): that hold must learn that it
// is lost.
func TestAGrantDuringALocalHandoffLosesTheHold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := aclClient(t, srv, "+@all", "-client")                                                 // no tracking: nothing else tells
	r := newRegistry(t, client, WithRetryInterval(time.Second), WithLocalHandoff(100, time.Minute)) // every round hands off
	lock := r.Obtain("g")
	hits, handedOff := 0, 0
	for i := 0; i < 20 && hits < 3; i++ {
		h1, err := lock.Acquire(ctx)
		require.NoError(t, err)
		token := int64(1_000_000 + i)
		// The key as another owner's release granting it back left it
		// (with a longer time to live than a grant's, which a loaded
		// machine could outlast before the hand-off: the give-back then
		// spares the key, and the hold is lost all the same).
		require.NoError(t, client.Set(ctx, h1.redisKey(), r.clientID, time.Minute).Err())
		require.NoError(t, client.Set(ctx, lock.keys().Fence(), strconv.FormatInt(token, 10), time.Minute).Err())
		next := make(chan *Hold, 1)
		go func() {
			h, err := lock.Acquire(ctx)
			require.NoError(t, err)
			next <- h
		}()
		require.Eventually(t, func() bool { return waitersOf(r, "g") == 1 }, time.Second, time.Millisecond)
		local, _ := r.locals.m.Load("g")
		inWindow := make(chan bool, 1)
		go func() {
			for local.hold.Load() == h1 {
			}
			// The grant's note lands now.
			window := local.hold.Load() == nil
			r.receiveGrant("g", token)
			inWindow <- window
		}()
		// h1 may learn of the loss too (it shares h2's tenure), if the
		// grant's give-back judges it first; h2 must.
		if err := h1.Release(ctx); err != nil {
			require.ErrorIs(t, err, ErrLockLost)
		}
		h2 := <-next
		if <-inWindow {
			hits++
		}
		// A round whose release went to Redis (the release found the
		// hold's loss first, say) has no hand-off to judge: its h2 took
		// the key afresh.
		if h2.via == viaHandoff {
			handedOff++
			select {
			case <-h2.Lost():
			case <-time.After(200 * time.Millisecond):
			}
			err = h2.Release(ctx)
			require.ErrorIs(t, err, ErrLockLost, "round %d: the hold handed off is told that its key went through another owner", i)
		} else {
			_ = h2.Release(ctx)
		}
		requireNoLocalState(t, r)
		requireSettledGiveBacks(t, r)
	}
	t.Logf("grants in the window: %d; rounds handed off: %d", hits, handedOff)
	require.GreaterOrEqual(t, handedOff, 5, "most rounds hand off")
}

// requireSettledGiveBacks waits until r gave back every grant nobody took.
func requireSettledGiveBacks(t *testing.T, r *Registry) {
	t.Helper()
	require.Eventually(t, func() bool { return r.grants.pending.Size() == 0 }, 5*time.Second, time.Millisecond)
}

// TestAGrantDuringItsHoldsReleaseLosesTheHold: the key went through
// another registry behind the hold's back (here, as that registry's
// release left it: the key this registry's again, with the grant lease and
// the grant's token), and the grant's note lands while the hold's own
// release is on its way to Redis. That release finds the key the
// registry's and deletes it; tracking reads back the registry's own client
// id. Only the grant tells that the key had another owner meanwhile: the
// release must report the hold lost, not nil. A grant's note that came
// late, whose grant an attempt of this registry took (which drew a newer
// token), tells nothing of the sort.
func TestAGrantDuringItsHoldsReleaseLosesTheHold(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprint("late=", late), func(t *testing.T) { grantDuringRelease(t, late, false) })
	}
	// The release's ctx ends as its script's reply comes: the read of the
	// key's last token that judges the grant must not end with it.
	t.Run("ctxEnds", func(t *testing.T) { grantDuringRelease(t, false, true) })
}

func grantDuringRelease(t *testing.T, late, ctxEnds bool) {
	ctx := context.Background()
	releaseCtx, endRelease := context.WithCancel(ctx)
	defer endRelease()
	srv := redistest.Start(t)
	var (
		r         *Registry
		armed     atomic.Bool
		releasing atomic.Bool // the release's first call was seen
		token     = int64(1_000_000)
	)
	// The release's script call, told by its script: a renewal may run
	// beside it.
	releaseHash := protocol.NewPeer(scripts, protocol.Config{}).Release(protocol.Keys{}, "", protocol.Release{}).Script.Hash()
	isRelease := func(cmd redis.Cmder) bool {
		args := cmd.Args()
		if len(args) < 2 {
			return false
		}
		switch cmd.Name() {
		case "evalsha":
			return args[1] == releaseHash
		case "eval": // after NOSCRIPT, with the script's text
			src, _ := args[1].(string)
			return redis.NewScript(src).Hash() == releaseHash
		}
		return false
	}
	grantFirst := func(cmds ...redis.Cmder) {
		for _, cmd := range cmds {
			if armed.Load() && isRelease(cmd) && armed.CompareAndSwap(true, false) {
				r.receiveGrant("g", token) // the grant's note lands now
				releasing.Store(true)
				return
			}
		}
	}
	replied := func(cmds ...redis.Cmder) {
		for _, cmd := range cmds {
			// The release's last call: not one that asks for every
			// argument (4), after which it is sent again.
			if c, ok := cmd.(*redis.Cmd); ok && ctxEnds && releasing.Load() && isRelease(cmd) && c.Err() == nil && c.Val() != nil && c.Val() != int64(4) {
				endRelease()
			}
		}
	}
	client := srv.Client(t, redistest.Hook{
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				grantFirst(cmd)
				err := next(ctx, cmd)
				replied(cmd)
				return err
			}
		},
		ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
			return func(ctx context.Context, cmds []redis.Cmder) error {
				grantFirst(cmds...)
				err := next(ctx, cmds)
				replied(cmds...)
				return err
			}
		},
	})
	r = newRegistry(t, client, WithRetryInterval(time.Second))
	lock := r.Obtain("g")
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	// The key as another owner's release granting it back left it (with
	// a minute to live, which no loaded machine outlasts before the
	// release).
	raw := srv.Client(t)
	require.NoError(t, raw.Set(ctx, h.redisKey(), r.clientID, time.Minute).Err())
	last := token
	if late {
		last++ // the attempt that took the granted key drew a newer token
	}
	require.NoError(t, raw.Set(ctx, lock.keys().Fence(), strconv.FormatInt(last, 10), time.Minute).Err())
	armed.Store(true)
	err = h.Release(releaseCtx)
	require.False(t, armed.Load(), "the release's script call was not seen")
	if late {
		require.NoError(t, err, "a late note of a grant this registry took")
	} else {
		require.ErrorIs(t, err, ErrLockLost, "the hold is told that its key went through another owner")
	}
	requireNoLocalState(t, r)
	requireSettledGiveBacks(t, r)
}

// TestAGrantWhoseGiveBackTrailsItsHoldsReleaseLosesTheHold: the grant's
// note lands while the hold is current (the key went through another
// registry behind the hold's back and came back by that grant), so it is
// given back in the background; the hold's release reaches Redis before
// that give-back, finds the key the registry's and deletes it. The give-
// back then finds the key gone and no current hold: the release must
// still report the hold lost, not nil.
func TestAGrantWhoseGiveBackTrailsItsHoldsReleaseLosesTheHold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	const token = int64(1_000_000)
	g := newScriptGate() // for the give-back's call
	client := srv.Client(t, g.hook())
	r := newRegistry(t, client, WithRetryInterval(time.Second))
	lock := r.Obtain("g")
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	raw := srv.Client(t)
	require.NoError(t, raw.Set(ctx, h.redisKey(), r.clientID, time.Minute).Err())
	require.NoError(t, raw.Set(ctx, lock.keys().Fence(), strconv.FormatInt(token, 10), time.Minute).Err())
	g.armed.Store(true)
	r.receiveGrant("g", token) // lands while the hold is current
	<-g.blocked
	released := make(chan error, 1)
	go func() { released <- h.Release(ctx) }()
	// The release does not wait for the give-back to be let through: it
	// either returns before it (on HEAD, nil) or once it is.
	var rerr error
	select {
	case rerr = <-released:
		close(g.gate)
	case <-time.After(2 * time.Second):
		close(g.gate)
		rerr = <-released
	}
	require.ErrorIs(t, rerr, ErrLockLost, "the hold is told that its key went through another owner")
	requireSettledGiveBacks(t, r)
	requireNoLocalState(t, r)
}

// TestAGrantBehindAHoldNamesWhatCameFirst: a grant that lands on a hold
// whose lease had run out (unsignalled yet) brings back a key that lapsed
// behind it, and one on a hold whose forced unlock's note came, a key an
// operator forced open: the give-back names the holds' losses expired and
// forced, as a renewal that found the key another's would.
func TestAGrantBehindAHoldNamesWhatCameFirst(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	raw := srv.Client(t)
	lapsed, forced := lapsedAndForced(t, untrackedRegistry(t, srv)) // nothing else tells
	r := lapsed.lock.r
	for i, h := range []*Hold{lapsed, forced} {
		// The key as another owner's release granting it back left it.
		token := int64(1_000_000 + i)
		require.NoError(t, raw.Set(ctx, h.redisKey(), r.clientID, r.grants.lease).Err())
		require.NoError(t, raw.Set(ctx, h.lock.keys().Fence(), strconv.FormatInt(token, 10), time.Minute).Err())
		r.receiveGrant(h.Key(), token) // lands while h is current
	}
	requireSettledGiveBacks(t, r)
	requireCause(t, lapsed, LossExpired)
	requireCause(t, forced, LossForced)
}
