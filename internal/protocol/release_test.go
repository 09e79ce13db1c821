package protocol

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The rules of release.lua, and of the grant (docs/PROTOCOL.md, Waiting
// and hand-off rules), each on the real server.

func TestReleaseWithTheClientIDAloneDeletesOurKey(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	require.Equal(t, []string{k.Lock(), k.Marker()}, p.Release(k, "k", Release{}).Keys, "the keys it reads, and no more")
	require.Equal(t, ReleaseReply{Outcome: Deleted}, e.release(p, k, Release{}))
	require.Empty(t, e.owner(k))
}

func TestReleaseSparesAnotherOwnersKey(t *testing.T) {
	for name, o := range map[string]Release{"client id alone": {}, "full": {Full: true}} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			holder, k := e.holder()
			p := e.peer()
			require.Equal(t, ReleaseReply{Outcome: NotOurs}, e.release(p, k, o))
			require.Equal(t, holder.ClientID(), e.owner(k))
			require.Positive(t, e.pttl(k.Lock()))
		})
	}
}

// A release of a key taken from this registry grants it to nobody, even
// with a registry waiting: the key stays its holder's, and the waiter
// keeps its mark and its place.
func TestAReleaseOfAKeyNotOursGrantsItToNobody(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	require.Equal(t, ReleaseReply{Outcome: NotOurs}, e.release(e.peer(), c.k, Release{Full: true}))
	require.Equal(t, c.holder.ClientID(), e.owner(c.k))
	e.requireMarked(c.k, markOf(c.waiter, testGrantLease), true)
}

// The client id alone cannot grant: a release that finds a live mark
// asks for every argument rather than delete the key under a waiter.
func TestReleaseWithTheClientIDAloneNeedsArgumentsWhenAnotherRegistryWaits(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	waiter := e.peer()
	e.wait(waiter, k)
	require.Equal(t, ReleaseReply{Outcome: NeedsArguments}, e.release(p, k, Release{}))
	require.Equal(t, p.ClientID(), e.owner(k))
	e.requireMarked(k, markOf(waiter, testGrantLease), true)
}

// A mark that lapsed is no waiter: the client id alone deletes the key.
func TestReleaseWithTheClientIDAloneDeletesOurKeyPastALapsedMark(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	e.wait(e.peer(lapsing), k)
	time.Sleep(2*shortRetry + 5*time.Millisecond)
	require.Equal(t, ReleaseReply{Outcome: Deleted}, e.release(p, k, Release{}))
	require.Empty(t, e.owner(k))
}

// A lapsed mark is no waiter even while its marker lives on, kept by a
// longer mark withdrawn since: the client id alone still deletes the key.
func TestReleaseWithTheClientIDAloneDeletesOurKeyPastALapsedMarkInALiveMarker(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	withdrawn := e.peer()
	e.wait(withdrawn, k)
	e.wait(e.peer(lapsing), k)
	e.runAll(withdrawn.Withdraw(k))
	time.Sleep(2*shortRetry + 5*time.Millisecond)
	require.Positive(t, e.pttl(k.Marker()), "the withdrawn mark's time to live keeps the marker")
	require.Equal(t, ReleaseReply{Outcome: Deleted}, e.release(p, k, Release{}))
	require.Empty(t, e.owner(k))
}

// contended is a key held by a holder that a waiter, taking grants,
// marked as waiting, with a subscription to the waiter's grant channel.
type contended struct {
	k              Keys
	holder, waiter *Peer
	lastToken      int64 // what the waiter's attempt replied
	grants         *redis.PubSub
}

func (e *env) contended() contended {
	e.t.Helper()
	c := contended{waiter: e.peer()}
	c.holder, c.k = e.holder()
	c.lastToken = e.wait(c.waiter, c.k)
	c.grants = e.subscribe(GrantChannel(e.namespace, c.waiter.ClientID()))
	return c
}

// requireGranted requires that grantee holds k with the grant lease and
// token, and heard of it on its grant channel.
func (e *env) requireGranted(k Keys, grantee *Peer, grants *redis.PubSub, token int64) {
	e.t.Helper()
	require.Equal(e.t, grantee.ClientID(), e.owner(k))
	require.Positive(e.t, e.pttl(k.Lock()))
	require.LessOrEqual(e.t, e.pttl(k.Lock()), testGrantLease)
	require.Equal(e.t, token, e.fence(k))
	channel := GrantChannel(e.namespace, grantee.ClientID())
	e.received(grants, channel, "g"+strconv.FormatInt(token, 10)+":"+grantee.ClientID()+":k")
	e.requireMarked(k, markOf(grantee, testGrantLease), false)
}

func TestAFullReleaseGrantsTheKeyToAWaitingRegistry(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	require.Equal(t, ReleaseReply{Outcome: Granted}, e.release(c.holder, c.k, Release{Full: true}))
	token := e.fence(c.k)
	require.Greater(t, token, c.lastToken, "the trust rule: a grant's token exceeds the one its mark reported")
	e.requireGranted(c.k, c.waiter, c.grants, token)
}

func TestAGrantWithMarkNextMarksTheReleasingRegistry(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	found := e.release(c.holder, c.k, Release{Full: true, MarkNext: true})
	require.Equal(t, Granted, found.Outcome)
	e.requireGranted(c.k, c.waiter, c.grants, found.MarkToken)
	e.requireMarked(c.k, markOf(c.holder, testGrantLease), true)
}

func TestAGrantDrawsAboveTheTokenHandedOut(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	handedOut := e.serverMicros() + int64(time.Hour/time.Microsecond)
	require.Equal(t, Granted, e.release(c.holder, c.k, Release{HandedOut: handedOut}).Outcome)
	e.requireGranted(c.k, c.waiter, c.grants, handedOut+1)
}

// A stored token ahead of the clock (a fence raised by ForceUnlock, or a
// clock that stepped back): the grant draws past it, and its message
// carries that token, not the clock's.
func TestAGrantDrawsAboveAStoredTokenAheadOfTheClock(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	ahead := e.serverMicros() + int64(time.Hour/time.Microsecond)
	require.NoError(t, e.client.Set(e.ctx, c.k.Fence(), ahead, time.Minute).Err())
	require.Equal(t, Granted, e.release(c.holder, c.k, Release{Full: true}).Outcome)
	e.requireGranted(c.k, c.waiter, c.grants, ahead+1)
}

// A stored token just above the one handed out: the draw's floor, the
// token handed out + 1, is the stored token itself, and the grant's token
// must still be past it, not the stored token again.
func TestAGrantDrawsAboveAStoredTokenJustAboveTheTokenHandedOut(t *testing.T) {
	e := newEnv(t)
	c := e.contended()
	ahead := e.serverMicros() + int64(time.Hour/time.Microsecond)
	require.NoError(t, e.client.Set(e.ctx, c.k.Fence(), ahead, time.Minute).Err())
	require.Equal(t, Granted, e.release(c.holder, c.k, Release{HandedOut: ahead - 1}).Outcome)
	e.requireGranted(c.k, c.waiter, c.grants, ahead+1)
}

// markInTurn marks each of peers as waiting for k, in order, each in a
// later millisecond than the last: the queue's scores are milliseconds.
func (e *env) markInTurn(k Keys, peers ...*Peer) {
	e.t.Helper()
	for _, p := range peers {
		e.wait(p, k)
		time.Sleep(2 * time.Millisecond)
	}
}

func TestGrantsGoFirstComeFirstServed(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	first, second := e.peer(), e.peer()
	e.markInTurn(k, first, second)
	require.Equal(t, Granted, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, first.ClientID(), e.owner(k))
	require.Equal(t, Granted, e.release(first, k, Release{Full: true}).Outcome)
	require.Equal(t, second.ClientID(), e.owner(k))
}

// Every attempt of a waiting registry renews its mark, which must not
// cost it its place.
func TestARenewedMarkKeepsItsPlaceInTheQueue(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	first, second := e.peer(), e.peer()
	e.markInTurn(k, first, second, first)
	require.Equal(t, Granted, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, first.ClientID(), e.owner(k))
}

// A mark new to the marker starts a wait: a place left in the queue by an
// earlier one (a withdrawal, two ZREMs in a pipeline, cut off after the
// marker's) is replaced, not kept ahead of those who waited since.
func TestANewWaitReplacesAPlaceLeftInTheQueue(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	returning, waiting := e.peer(), e.peer()
	e.markInTurn(k, waiting)
	left := redis.Z{Score: 1, Member: markOf(returning, testGrantLease)}
	require.NoError(t, e.client.ZAdd(e.ctx, k.Queue(), left).Err())
	e.wait(returning, k)
	require.Equal(t, Granted, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, waiting.ClientID(), e.owner(k))
}

func TestAGrantSkipsALapsedMark(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	gone, live := e.peer(lapsing), e.peer()
	e.markInTurn(k, gone, live)
	time.Sleep(2*shortRetry + 5*time.Millisecond)
	require.Equal(t, Granted, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, live.ClientID(), e.owner(k))
	e.requireMarked(k, markOf(gone, testGrantLease), false)
}

// A registry that takes no grants is woken instead: the key is deleted
// for all its waiters to race for.
func TestAReleaseWhoseLiveMarkTakesNoGrantsDeletesTheKeyAndWakesTheWaiters(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	waiter := e.peer(noGrants)
	e.wait(waiter, k)
	wakeUps := e.subscribe(ReleaseChannel(e.namespace))
	require.Equal(t, ReleaseReply{Outcome: DeletedWaited}, e.release(holder, k, Release{Full: true}))
	require.Empty(t, e.owner(k))
	e.received(wakeUps, ReleaseChannel(e.namespace), "wk")
}

// A registry that takes no grants goes to the back of the queue once
// woken, so that it cannot hold up the grants of those behind it.
func TestAWokenRegistryGoesToTheBackOfTheQueue(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	woken, behind := e.peer(noGrants), e.peer()
	e.markInTurn(k, woken, behind)
	require.Equal(t, DeletedWaited, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, []string{markOf(behind, testGrantLease), markOf(woken, 0)}, e.members(k.Queue()))
	require.Positive(t, e.pttl(k.Queue()), "the queue expires with the marker")
}

// A woken registry that was the queue's only member: popping it deleted
// the queue with its time to live, and the queue it goes back to must
// expire with the marker all the same.
func TestAWokenRegistryAloneInTheQueueRequeuesWithATimeToLive(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	woken := e.peer(noGrants)
	e.wait(woken, k)
	require.Equal(t, DeletedWaited, e.release(holder, k, Release{Full: true}).Outcome)
	require.Equal(t, []string{markOf(woken, 0)}, e.members(k.Queue()))
	require.Positive(t, e.pttl(k.Queue()), "the queue expires with the marker")
}

// fenceRaises are a token handed out past the stored one, and one below
// it: a release raises the fence to the first, and leaves it for the
// second.
var fenceRaises = []struct {
	name  string
	ahead int64 // how far the token handed out is past the stored one
	want  int64 // how far the stored token moves
}{
	{"past the stored token", 1000, 1000},
	{"not below it", -1000, 0},
}

// Local hand-offs raise the token without a round trip: the stored token
// must not fall behind them.
func TestHandedOutRaisesTheStoredToken(t *testing.T) {
	for _, c := range fenceRaises {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			p, k := e.holder()
			token := e.drawToken(p, k)
			require.Equal(t, Deleted, e.release(p, k, Release{HandedOut: token + c.ahead}).Outcome)
			require.Equal(t, token+c.want, e.fence(k))
		})
	}
}

// A release of a key taken from this registry leaves the key alone and
// raises the fence to the token handed out, if it is behind it: never
// lower.
func TestAReleaseOfAKeyNotOursRaisesTheFenceOnlyIfBehind(t *testing.T) {
	for _, c := range fenceRaises {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			holder, k := e.holder()
			token := e.drawToken(holder, k)
			require.Equal(t, NotOurs, e.release(e.peer(), k, Release{HandedOut: token + c.ahead}).Outcome)
			require.Equal(t, holder.ClientID(), e.owner(k))
			require.Equal(t, token+c.want, e.fence(k))
		})
	}
}

// A give-back returns a grant nobody took, but must spare a hold the
// grantee took of the key since.
func TestAGiveBackDeletesTheGrantOnlyWhileItIsUntouched(t *testing.T) {
	for _, c := range []struct {
		name string
		// since is what happened to the granted key before the give-back.
		since func(e *env, c contended)
		want  ReleaseOutcome
	}{
		{"deleted while untouched", func(*env, contended) {}, Deleted},
		{"spared once a hold drew a newer token", func(e *env, c contended) {
			found, err := ReadObtain(e.run(c.waiter.Obtain(c.k, true, true)))
			require.NoError(e.t, err)
			require.True(e.t, found.Held)
		}, NotOurs},
		{"spared with a lease longer than the grant's", func(e *env, c contended) {
			// A plain SET after the grant expired keeps the grant's token.
			require.NoError(e.t, e.client.Set(e.ctx, c.k.Lock(), c.waiter.ClientID(), testLease).Err())
		}, NotOurs},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			granted := e.contended()
			require.Equal(t, Granted, e.release(granted.holder, granted.k, Release{Full: true}).Outcome)
			token := e.fence(granted.k)
			c.since(e, granted)
			require.Equal(t, c.want, e.release(granted.waiter, granted.k, Release{GiveBack: token}).Outcome)
			if c.want == NotOurs {
				require.Equal(t, granted.waiter.ClientID(), e.owner(granted.k))
			} else {
				require.Empty(t, e.owner(granted.k))
			}
		})
	}
}

// Where the grant lease is the whole lease (a retry interval of half the
// lease or more), a hold the grantee took since has a time to live within
// the grant lease: only its newer token spares it from the give-back.
func TestAGiveBackSparesAHoldWhoseLeaseIsTheGrantLease(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	waiter := e.peer(func(cfg *Config) { cfg.Lease = cfg.GrantLease })
	e.wait(waiter, k)
	require.Equal(t, Granted, e.release(holder, k, Release{Full: true}).Outcome)
	token := e.fence(k)
	found, err := ReadObtain(e.run(waiter.Obtain(k, true, true)))
	require.NoError(t, err)
	require.True(t, found.Held)
	require.LessOrEqual(t, e.pttl(k.Lock()), testGrantLease, "within the grant lease")
	require.Equal(t, NotOurs, e.release(waiter, k, Release{GiveBack: token}).Outcome)
	require.Equal(t, waiter.ClientID(), e.owner(k))
}

// Beyond 2^53 (a fence written by hand), where Lua's doubles skip
// integers, an attempt still replies the key's last token exactly, a grant
// draws exactly one past a stored or handed-out token and a release keeps
// the stored token from falling behind the one handed out: otherwise a
// grant drawn before a mark could pass the trust rule, or repeat a token.
func TestGrantsAndMarksKeepExactTokensBeyond2To53(t *testing.T) {
	const big = int64(1)<<53 + 1 // odd: no double holds it
	t.Run("the attempt's reply and the grant", func(t *testing.T) {
		e := newEnv(t)
		holder, k := e.holder()
		require.NoError(t, e.client.Set(e.ctx, k.Fence(), big, time.Minute).Err())
		waiter := e.peer()
		require.Equal(t, big, e.wait(waiter, k), "the key's last token, exactly")
		grants := e.subscribe(GrantChannel(e.namespace, waiter.ClientID()))
		found := e.release(holder, k, Release{Full: true, MarkNext: true})
		require.Equal(t, ReleaseReply{Outcome: Granted, MarkToken: big + 1}, found)
		e.requireGranted(k, waiter, grants, big+1)
	})
	t.Run("a grant above the token handed out", func(t *testing.T) {
		e := newEnv(t)
		c := e.contended()
		require.Equal(t, Granted, e.release(c.holder, c.k, Release{HandedOut: big}).Outcome)
		e.requireGranted(c.k, c.waiter, c.grants, big+1)
	})
	t.Run("the stored token follows the one handed out", func(t *testing.T) {
		e := newEnv(t)
		p, k := e.holder()
		require.NoError(t, e.client.Set(e.ctx, k.Fence(), big+2, time.Minute).Err())
		require.Equal(t, Deleted, e.release(p, k, Release{HandedOut: big + 3}).Outcome)
		require.Equal(t, big+3, e.fence(k))
	})
}
