package protocol

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The rules of docs/PROTOCOL.md's Scripts, each on the real server.

func TestSetIfFreeTakesAFreeKeyWithTheClientIDAndTheLease(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	require.Equal(t, p.ClientID(), e.owner(k))
	require.Positive(t, e.pttl(k.Lock()))
	require.LessOrEqual(t, e.pttl(k.Lock()), testLease)
}

func TestSetIfFreeDoesNotTakeAHeldKey(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	p := e.peer()
	held, err := ReadSetIfFree(e.run(p.SetIfFree(k)))
	require.NoError(t, err)
	require.False(t, held)
	require.Equal(t, holder.ClientID(), e.owner(k))
}

func TestObtainOfAHeldKeyMarksTheRegistryWaiting(t *testing.T) {
	for _, c := range []struct {
		name       string
		grantLease time.Duration
	}{
		{"a registry that takes grants names its grant lease", testGrantLease},
		{"a registry that takes none marks with its bare client id", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			holder, k := e.holder()
			p := e.peer(func(cfg *Config) { cfg.GrantLease = c.grantLease })
			e.wait(p, k)
			e.requireMarked(k, markOf(p, c.grantLease), true)
			require.Equal(t, holder.ClientID(), e.owner(k), "the holder's key is untouched")
		})
	}
}

// Registries with longer retry intervals mark for longer: a short mark
// must not cut the marker's time to live, which would delete theirs.
func TestAShortMarkDoesNotCutTheMarkersTTL(t *testing.T) {
	e := newEnv(t)
	_, k := e.holder()
	e.wait(e.peer(), k)
	e.wait(e.peer(lapsing), k)
	for _, set := range []string{k.Marker(), k.Queue()} {
		require.Greater(t, e.pttl(set), 2*shortRetry, set)
	}
}

func TestObtainOfAHeldKeyRepliesMinusTheKeysLastToken(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	p := e.peer()
	token := e.drawToken(holder, k)
	require.Equal(t, token, e.wait(p, k))
}

// The reply must be a token the grant that answers the mark can exceed,
// even when the holder never drew one.
func TestObtainDrawsTheLastTokenFromTheClockWhenNoneIsStored(t *testing.T) {
	e := newEnv(t)
	_, k := e.holder()
	p := e.peer()
	before := e.serverMicros()
	token := e.wait(p, k)
	require.GreaterOrEqual(t, token, before)
	require.LessOrEqual(t, token, e.serverMicros())
	require.Equal(t, token, e.fence(k), "the token drawn is stored")
}

// A stored last token that is no token (written by hand: "-1", "0",
// "-7.5") counts as none: obtain.lua's reply must neither say that a key
// another owner holds is held ("-1" would reply 1) nor carry a token that
// no grant can be trusted against.
func TestObtainTreatsAStoredLastTokenThatIsNoTokenAsNone(t *testing.T) {
	for _, stored := range []string{"-1", "0", "-7.5", "-1.5"} {
		t.Run(stored, func(t *testing.T) {
			e := newEnv(t)
			holder, k := e.holder()
			require.NoError(t, e.client.Set(e.ctx, k.Fence(), stored, testLease).Err())
			before := e.serverMicros()
			found, err := ReadObtain(e.run(e.peer().Obtain(k, true, false)))
			require.NoError(t, err)
			require.False(t, found.Held, "another owner holds it")
			require.GreaterOrEqual(t, found.LastToken, before, "a token from the clock")
			require.Equal(t, found.LastToken, e.fence(k), "and stored")
			require.Equal(t, holder.ClientID(), e.owner(k))
		})
	}
}

// An attempt that will not wait leaves no mark, which a release would
// grant to nobody.
func TestObtainThatWillNotWaitLeavesNoMark(t *testing.T) {
	e := newEnv(t)
	_, k := e.holder()
	p := e.peer()
	found, err := ReadObtain(e.run(p.Obtain(k, false, false)))
	require.NoError(t, err)
	require.Equal(t, ObtainReply{}, found)
	require.Empty(t, e.members(k.Marker()))
	require.Empty(t, e.members(k.Queue()))
}

func TestObtainOfOurOwnKeyRefreshesTheLeaseAndDrawsANewerToken(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	token := e.drawToken(p, k)
	require.NoError(t, e.client.PExpire(e.ctx, k.Lock(), time.Second).Err())
	found, err := ReadObtain(e.run(p.Obtain(k, true, false)))
	require.NoError(t, err)
	require.True(t, found.Held)
	require.Greater(t, e.pttl(k.Lock()), time.Second, "the lease is refreshed")
	require.Greater(t, e.fence(k), token, "a give-back of the grant's token now spares the key")
}

// A success withdraws the mark an earlier attempt set, whether or not
// this attempt would have waited: the mark withdrawn is the one a waiting
// attempt set, with its grant lease. (No acquisition makes an attempt that
// will not wait with a mark today: such an acquisition never has one.)
func TestASuccessfulObtainWithdrawsTheMark(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			e := newEnv(t)
			_, k := e.holder()
			p := e.peer()
			e.wait(p, k)
			require.NoError(t, e.client.Del(e.ctx, k.Lock()).Err())
			found, err := ReadObtain(e.run(p.Obtain(k, wait, true)))
			require.NoError(t, err)
			require.True(t, found.Held)
			e.requireMarked(k, markOf(p, testGrantLease), false)
		})
	}
}

func TestRenewExtendsOnlyOurKeys(t *testing.T) {
	e := newEnv(t)
	p, other := e.peer(), e.peer()
	ours, theirs, free := p.Keys("ours"), p.Keys("theirs"), p.Keys("free")
	e.hold(p, ours)
	e.hold(other, theirs)
	for _, k := range []Keys{ours, theirs} {
		require.NoError(t, e.client.PExpire(e.ctx, k.Lock(), time.Second).Err())
	}
	renewed, err := ReadRenew(e.run(p.Renew([]string{ours.Lock(), theirs.Lock(), free.Lock()})))
	require.NoError(t, err)
	require.Equal(t, []OwnerState{Ours, Other, Gone}, renewed)
	require.Greater(t, e.pttl(ours.Lock()), time.Second)
	require.LessOrEqual(t, e.pttl(theirs.Lock()), time.Second, "another owner's lease is untouched")
	require.Empty(t, e.owner(free), "a free key stays free")
}

// The fence lives a lease after the last draw (docs/PROTOCOL.md, Keys),
// and no longer: a lock no registry uses any more leaves nothing behind.
func TestTheFenceLivesALeaseAfterTheLastDraw(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	e.drawToken(p, k)
	require.Positive(t, e.pttl(k.Fence()))
	require.LessOrEqual(t, e.pttl(k.Fence()), testLease)
}

func TestDrawTokenGivesStrictlyRisingTokens(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	last := e.drawToken(p, k)
	for range 5 {
		token := e.drawToken(p, k)
		require.Greater(t, token, last)
		last = token
	}
	// A stored token ahead of the clock (one that stepped back) still
	// rises by one.
	ahead := e.serverMicros() + int64(time.Hour/time.Microsecond)
	require.NoError(t, e.client.Set(e.ctx, k.Fence(), ahead, testLease).Err())
	require.Equal(t, ahead+1, e.drawToken(p, k))
}

func TestDrawTokenIsZeroForAKeyThatIsNotOurs(t *testing.T) {
	e := newEnv(t)
	p, other := e.peer(), e.peer()
	theirs, free := p.Keys("theirs"), p.Keys("free")
	e.hold(other, theirs)
	for _, k := range []Keys{theirs, free} {
		token, err := ReadToken(e.run(p.DrawToken(k)))
		require.NoError(t, err)
		require.Zero(t, token, k.Lock())
	}
	require.Zero(t, e.fence(theirs), "no token is drawn")
}

// Redis may lose the fence (a restart, a failover): the clock keeps
// tokens rising.
func TestTokensKeepRisingAfterTheFenceIsLost(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	token := e.drawToken(p, k)
	require.NoError(t, e.client.Del(e.ctx, k.Fence()).Err())
	require.Greater(t, e.drawToken(p, k), token)
}

func TestForceUnlockDeletesTheKeyWhoeverHoldsIt(t *testing.T) {
	const margin = 1000
	for _, c := range []struct {
		name string
		// fence is the stored last token, given the server's clock; 0
		// stores none.
		fence func(now int64) int64
	}{
		{"past the last token by the margin", func(now int64) int64 { return now + int64(time.Hour/time.Microsecond) }},
		{"past the clock by the margin", func(int64) int64 { return 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			holder, k := e.holder()
			operator := e.peer(noGrants)
			before := e.serverMicros()
			last := c.fence(before)
			if last != 0 {
				require.NoError(t, e.client.Set(e.ctx, k.Fence(), last, testLease).Err())
			}
			sub := e.subscribe(ReleaseChannel(e.namespace))
			holderID, held, err := ReadForceUnlock(e.run(operator.ForceUnlock(k, "k", margin, 2*time.Second, "")))
			require.NoError(t, err)
			require.True(t, held)
			require.Equal(t, holder.ClientID(), holderID)
			require.Empty(t, e.owner(k))
			require.GreaterOrEqual(t, e.fence(k), max(last, before)+margin)
			require.LessOrEqual(t, e.fence(k), max(last, e.serverMicros())+margin)
			require.Positive(t, e.pttl(k.Fence()), "the raised fence expires")
			e.received(sub, ReleaseChannel(e.namespace), "f"+holder.ClientID()+":k", "wk")
		})
	}
}

// fenceTTL is the raised fence's least time to live: a fence that lives
// longer keeps its own, so that a stored token ahead of the clock does not
// expire before the clock passes it.
func TestForceUnlockKeepsALongerTimeToLiveOfTheFence(t *testing.T) {
	for _, c := range []struct {
		name     string
		fenceTTL time.Duration // of the stored token; 0 stores none
		least    time.Duration // the raised fence's least time to live
	}{
		{"a fence that lives longer keeps its time to live", time.Minute, 50 * time.Second},
		{"none is raised for fenceTTL", 0, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			_, k := e.holder()
			if c.fenceTTL != 0 {
				ahead := e.serverMicros() + int64(time.Hour/time.Microsecond)
				require.NoError(t, e.client.Set(e.ctx, k.Fence(), ahead, c.fenceTTL).Err())
			}
			_, held, err := ReadForceUnlock(e.run(e.peer(noGrants).ForceUnlock(k, "k", 1000, 2*time.Second, "")))
			require.NoError(t, err)
			require.True(t, held)
			require.Greater(t, e.pttl(k.Fence()), c.least)
			require.LessOrEqual(t, e.pttl(k.Fence()), max(c.fenceTTL, 2*time.Second))
		})
	}
}

// Registries of earlier versions send no sixth argument, the only holder
// to force open: the script reads none as any, as it reads an empty one.
func TestForceUnlockFromAnEarlierVersionForcesAnyHolder(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	call := e.peer(noGrants).ForceUnlock(k, "k", 1000, 2*time.Second, "")
	call.Args = call.Args[:5]
	holderID, held, err := ReadForceUnlock(e.run(call))
	require.NoError(t, err)
	require.True(t, held)
	require.Equal(t, holder.ClientID(), holderID)
	require.Empty(t, e.owner(k))
}

func TestForceUnlockOfAFreeKeyRepliesNotHeld(t *testing.T) {
	e := newEnv(t)
	p := e.peer()
	k := p.Keys("k")
	holder, held, err := ReadForceUnlock(e.run(p.ForceUnlock(k, "k", 1000, 2*time.Second, "")))
	require.NoError(t, err)
	require.False(t, held)
	require.Empty(t, holder)
	require.Zero(t, e.fence(k), "the fence is untouched")
}

func TestForceUnlockOfOneHolderSparesAnother(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	operator := e.peer(noGrants)
	sub := e.subscribe(ReleaseChannel(e.namespace))
	_, held, err := ReadForceUnlock(e.run(operator.ForceUnlock(k, "k", 1000, 2*time.Second, "another registry")))
	require.NoError(t, err)
	require.False(t, held, "the key is not the named registry's")
	require.Equal(t, holder.ClientID(), e.owner(k), "the holder keeps it")
	require.Zero(t, e.fence(k), "the fence is untouched")
	holderID, held, err := ReadForceUnlock(e.run(operator.ForceUnlock(k, "k", 1000, 2*time.Second, holder.ClientID())))
	require.NoError(t, err)
	require.True(t, held)
	require.Equal(t, holder.ClientID(), holderID)
	require.Empty(t, e.owner(k))
	e.received(sub, ReleaseChannel(e.namespace), "f"+holder.ClientID()+":k", "wk")
}

// A lock key of another type, made by hand, blocks the lock as a foreign
// value does, and Inspect shows it held by "" (ReadLocks): a forced unlock
// frees it as it would that value, and one that names a holder spares it.
func TestForceUnlockOfAKeyOfAnotherTypeFreesItAsAForeignValue(t *testing.T) {
	e := newEnv(t)
	operator := e.peer(noGrants)
	k := operator.Keys("k")
	t.Cleanup(func() { e.client.Del(e.ctx, k.Lock()) })
	require.NoError(t, e.client.HSet(e.ctx, k.Lock(), "field", "value").Err())
	_, held, err := ReadForceUnlock(e.run(operator.ForceUnlock(k, "k", 1000, 2*time.Second, "a registry")))
	require.NoError(t, err)
	require.False(t, held, "no registry's")
	require.EqualValues(t, 1, e.client.Exists(e.ctx, k.Lock()).Val(), "spared")
	before := e.serverMicros()
	sub := e.subscribe(ReleaseChannel(e.namespace))
	holder, held, err := ReadForceUnlock(e.run(operator.ForceUnlock(k, "k", 1000, 2*time.Second, "")))
	require.NoError(t, err)
	require.True(t, held)
	require.Empty(t, holder, "as Inspect names it")
	require.Zero(t, e.client.Exists(e.ctx, k.Lock()).Val(), "freed")
	require.GreaterOrEqual(t, e.fence(k), before+1000, "the fence raised")
	e.received(sub, ReleaseChannel(e.namespace), "f:k", "wk")
}

func TestWithdrawRemovesThePeersMark(t *testing.T) {
	e := newEnv(t)
	_, k := e.holder()
	p, other := e.peer(), e.peer()
	e.wait(p, k)
	e.wait(other, k)
	e.runAll(p.Withdraw(k))
	e.requireMarked(k, markOf(p, testGrantLease), false)
	e.requireMarked(k, markOf(other, testGrantLease), true)
}

// While a lock's slot migrates, the scripts get its lock key alone and
// must not touch the others.
func TestOnTheLockKeyAloneObtainTakesAFreeKeyWithoutMarking(t *testing.T) {
	e := newEnv(t)
	holder, p := e.peer(), e.peer()
	free, held := p.Keys("free"), p.Keys("held")
	e.hold(holder, held)
	for _, c := range []struct {
		k    Keys
		want ObtainReply
	}{{free, ObtainReply{Held: true}}, {held, ObtainReply{}}} {
		found, err := ReadObtain(e.run(p.Obtain(c.k, true, false).OnLockKeyOnly()))
		require.NoError(t, err)
		require.Equal(t, c.want, found, c.k.Lock())
		require.Empty(t, e.members(c.k.Marker()), "no mark")
		require.Zero(t, e.fence(c.k), "no token")
	}
	require.Equal(t, p.ClientID(), e.owner(free))
}

func TestOnTheLockKeyAloneReleaseDeletesOurKeyDespiteAWaiter(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	waiter := e.peer()
	e.wait(waiter, k)
	found, err := ReadRelease(e.run(p.Release(k, "k", Release{}).OnLockKeyOnly()))
	require.NoError(t, err)
	require.Equal(t, Deleted, found.Outcome)
	require.Empty(t, e.owner(k))
}

// Without the fence, which may be on another node while the slot moves,
// no token is drawn: one from the clock alone could fall below the fence.
func TestOnTheLockKeyAloneNoTokenIsDrawn(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	token, err := ReadToken(e.run(p.DrawToken(k).OnLockKeyOnly()))
	require.ErrorIs(t, err, ErrFenceMoving)
	require.Zero(t, token)
	require.Zero(t, e.fence(k))
}

// A release on the lock key alone cannot store the tokens its hold handed
// out locally: RaiseFence does, on the fence alone, and never lowers it,
// exactly beyond 2^53.
func TestRaiseFenceRaisesOnlyAFenceBehind(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	require.Equal(t, int64(1), e.run(p.RaiseFence(k, 1000)).Val(), "no fence")
	require.Equal(t, int64(1000), e.fence(k))
	require.Positive(t, e.pttl(k.Fence()))
	require.Equal(t, int64(0), e.run(p.RaiseFence(k, 999)).Val())
	require.Equal(t, int64(1000), e.fence(k), "never lowered")
	require.Equal(t, int64(0), e.run(p.RaiseFence(k, 1000)).Val(), "a fence at the token is not behind it")
	require.NoError(t, e.client.Set(e.ctx, k.Fence(), "9007199254740993", time.Minute).Err())
	require.Equal(t, int64(1), e.run(p.RaiseFence(k, 9007199254740994)).Val())
	require.Equal(t, "9007199254740994", e.client.Get(e.ctx, k.Fence()).Val())
	require.Equal(t, int64(0), e.run(p.RaiseFence(k, 9007199254740993)).Val(), "beyond 2^53")
	require.Equal(t, int64(0), e.run(p.RaiseFence(k, 9007199254740994)).Val(), "beyond 2^53, at the token")
	require.Equal(t, "9007199254740994", e.client.Get(e.ctx, k.Fence()).Val())
	require.Equal(t, p.ClientID(), e.owner(k), "the lock key is left alone")
}

// ForceUnlockFence raises the fence as a forced unlock does, past the
// clock and the last token, and touches nothing else.
func TestForceUnlockFenceRaisesTheFenceOnly(t *testing.T) {
	e := newEnv(t)
	p, k := e.holder()
	last := e.drawToken(p, k)
	// The clock read before the call: one read after it may be more than
	// the margin later on a busy machine.
	before := e.serverMicros()
	require.Equal(t, int64(1), e.run(p.ForceUnlockFence(k, 1000, 2*time.Second)).Val())
	require.GreaterOrEqual(t, e.fence(k), last+1000)
	require.GreaterOrEqual(t, e.fence(k), before+1000, "past the clock by the margin")
	require.Equal(t, p.ClientID(), e.owner(k), "the lock key is left alone")
}

// A restarted Redis has lost the scripts: a pipeline's script calls go
// again by EVAL, which loads them.
func TestRunPipelineRunsScriptsRedisDoesNotHaveYet(t *testing.T) {
	e := newEnv(t)
	p := e.peer()
	k := p.Keys("k")
	require.NoError(t, e.client.ScriptFlush(e.ctx).Err())
	setIfFree, token, renew := p.SetIfFree(k), p.DrawToken(k), p.Renew([]string{k.Lock()})
	e.runAll([]*Call{&setIfFree, &token, &renew})
	held, err := ReadSetIfFree(setIfFree.Cmd)
	require.NoError(t, err)
	require.True(t, held, "the plain command ran once, not again with the scripts")
	tokenValue, err := ReadToken(token.Cmd)
	require.NoError(t, err)
	require.Positive(t, tokenValue)
	renewed, err := ReadRenew(renew.Cmd)
	require.NoError(t, err)
	require.Equal(t, []OwnerState{Ours}, renewed)
	loaded, err := e.client.ScriptExists(e.ctx, e.scripts.token.Hash(), e.scripts.renew.Hash()).Result()
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, loaded)
}

// ObtainReplicated sends obtain.lua by EVALSHA in its pipeline, and again
// by EVAL if Redis lost it: no SCRIPT LOAD, which the README's ACL lacks.
func TestObtainReplicatedRunsAScriptRedisDoesNotHaveYet(t *testing.T) {
	e := newEnv(t)
	p := e.peer()
	k := p.Keys("k")
	require.NoError(t, e.client.ScriptFlush(e.ctx).Err())
	found, acked, waitErr, err := ObtainReplicated(e.ctx, e.client, p.Obtain(k, true, false), 0, time.Second)
	require.NoError(t, err)
	require.NoError(t, waitErr)
	require.True(t, found.Held)
	require.Zero(t, acked, "no replicas")
	require.Equal(t, p.ClientID(), e.owner(k))
}

// Lua's numbers are doubles, exact up to 2^53 only: a stored last token
// beyond it (written by hand: the clock's microseconds stay below it) must
// still give strictly rising tokens, each above the stored one, never the
// same one twice nor one below it.
func TestDrawTokenRisesPastAStoredTokenBeyond2To53(t *testing.T) {
	// The stored text, and the token it was written as: the last two carry
	// over nines, and the third has leading zeros that a token's text has not.
	for stored, last := range map[string]int64{
		"9007199254740993":    1<<53 + 1,
		"9007199254740999":    9007199254740999,
		"999999999999999999":  999_999_999_999_999_999,
		"0009007199254740993": 1<<53 + 1,
		// Spelled as a float by hand: last + 1 would round back to last.
		"1e16":   10_000_000_000_000_000,
		"9.1e15": 9_100_000_000_000_000,
	} {
		e := newEnv(t)
		p, k := e.holder()
		require.NoError(t, e.client.Set(e.ctx, k.Fence(), stored, testLease).Err())
		for range 3 {
			token := e.drawToken(p, k)
			require.Equal(t, last+1, token, "after %s", stored)
			require.Equal(t, strconv.FormatInt(token, 10), e.client.Get(e.ctx, k.Fence()).Val(), "and stored as its text")
			last = token
		}
	}
}

// A fence written by hand as no number a token can follow (NaN, an
// infinity) is refused with an error that names it, and kept: a token
// from the clock would fall below what it stands for, and NaN read as the
// integer -2^63, which no token is.
func TestDrawTokenRefusesAFenceNoTokenCanFollow(t *testing.T) {
	for _, stored := range []string{"inf", "nan", "-nan"} {
		e := newEnv(t)
		p, k := e.holder()
		require.NoError(t, e.client.Set(e.ctx, k.Fence(), stored, testLease).Err())
		_, err := ReadToken(e.run(p.DrawToken(k)))
		require.ErrorContains(t, err, k.Fence(), stored)
		require.NotErrorIs(t, err, ErrFenceMoving, stored)
		require.Equal(t, stored, e.client.Get(e.ctx, k.Fence()).Val(), "kept")
	}
}

// Beyond 2^53 (a fence written by hand), where Lua's doubles skip
// integers, the forced fence must still be the margin past the last token,
// exactly: a holder may have handed out that many tokens past it locally.
func TestForceUnlockRaisesAFenceBeyond2To53ByTheWholeMargin(t *testing.T) {
	const margin = 1000
	for _, last := range []int64{1<<53 + 1, 999_999_999_999_999_999} {
		e := newEnv(t)
		_, k := e.holder()
		require.NoError(t, e.client.Set(e.ctx, k.Fence(), last, testLease).Err())
		_, held, err := ReadForceUnlock(e.run(e.peer(noGrants).ForceUnlock(k, "k", margin, 2*time.Second, "")))
		require.NoError(t, err)
		require.True(t, held)
		require.Equal(t, last+margin, e.fence(k))
	}
}
