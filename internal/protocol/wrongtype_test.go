package protocol

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A lock's fence, marker or queue of another type than the scripts write
// (made by hand, as SET <lock>:waiting x) fails the call that meets it,
// with an error that names that key and nothing written: no mark left
// behind for a release to grant the key to, no key taken by an attempt
// that reports failure.

// spoil makes one of k's keys a key of another type: a string where a
// sorted set belongs, else a hash.
func (e *env) spoil(key string, k Keys) {
	e.t.Helper()
	e.t.Cleanup(func() { e.client.Del(e.ctx, key) })
	if key == k.Fence() {
		require.NoError(e.t, e.client.HSet(e.ctx, key, "field", "value").Err())
		return
	}
	require.NoError(e.t, e.client.Set(e.ctx, key, "x", 0).Err())
}

// requireRefused requires that reply is a WRONGTYPE error naming key.
func requireRefused(t *testing.T, err error, key string) {
	t.Helper()
	require.True(t, WrongType(err), "%v", err)
	require.ErrorContains(t, err, key)
}

func TestAnAttemptThatMeetsAKeyOfAnotherTypeLeavesNoMark(t *testing.T) {
	for _, spoilt := range []func(Keys) string{Keys.Fence, Keys.Marker, Keys.Queue} {
		e := newEnv(t)
		_, k := e.holder()
		key := spoilt(k)
		t.Run(key[len(k.Lock()):], func(t *testing.T) {
			e.spoil(key, k)
			p := e.peer()
			_, err := ReadObtain(e.run(p.Obtain(k, true, false)))
			requireRefused(t, err, key)
			for _, set := range []string{k.Marker(), k.Queue()} {
				if set != key {
					require.Zero(t, e.client.Exists(e.ctx, set).Val(), "%s is written", set)
				}
			}
		})
	}
}

func TestAMarkedAttemptThatMeetsAKeyOfAnotherTypeLeavesTheKeyFree(t *testing.T) {
	for _, spoilt := range []func(Keys) string{Keys.Marker, Keys.Queue} {
		e := newEnv(t)
		_, k := e.holder()
		key := spoilt(k)
		t.Run(key[len(k.Lock()):], func(t *testing.T) {
			p := e.peer()
			e.wait(p, k)
			require.NoError(t, e.client.Del(e.ctx, k.Lock(), key).Err())
			e.spoil(key, k)
			_, err := ReadObtain(e.run(p.Obtain(k, true, true)))
			requireRefused(t, err, key)
			require.Empty(t, e.owner(k), "the attempt reported failure, yet took the key")
		})
	}
}

// A forced unlock is the way out of a stuck hold: a fence of another type
// fails every token.lua, and would else keep the lock from being forced
// open too. It is replaced as a lost fence is, past the clock by the
// margin, as that stands for every token drawn from it.
func TestForceUnlockReplacesAFenceOfAnotherType(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	e.spoil(k.Fence(), k)
	before := e.serverMicros()
	holderID, held, err := ReadForceUnlock(e.run(e.peer(noGrants).ForceUnlock(k, "k", 1000, 2*time.Second, "")))
	require.NoError(t, err)
	require.True(t, held)
	require.Equal(t, holder.ClientID(), holderID)
	require.Empty(t, e.owner(k))
	require.GreaterOrEqual(t, e.fence(k), before+1000, "the fence raised")
	require.Positive(t, e.pttl(k.Fence()), "the raised fence expires")
}

// A release that meets a marker, queue or fence of another type fails
// with an error that names it, and not a WRONGTYPE reply, which the
// registry reads as its lock key's (the hold overwritten, the key left
// held): the key stays the releaser's, to release again or let expire.
// A release whose key another registry took is told so, and its hold is
// lost, though the fence it would raise to its handed-out tokens is of
// another type: an error there would say the key is still its own. The
// fence fails every later draw of a token, so none can repeat.
func TestAReleaseOfAKeyTakenMeetsAFenceOfAnotherTypeAndIsNotOurs(t *testing.T) {
	e := newEnv(t)
	p := e.peer()
	k := p.Keys("k")
	other, _ := e.holder()
	e.spoil(k.Fence(), k)
	got, err := ReadRelease(e.run(p.Release(k, "k", Release{HandedOut: 5})))
	require.NoError(t, err)
	require.Equal(t, NotOurs, got.Outcome)
	require.Equal(t, other.ClientID(), e.owner(k), "the other registry keeps the key")
}

func TestAReleaseThatMeetsAKeyOfAnotherTypeNamesItAndKeepsTheKey(t *testing.T) {
	for _, c := range []struct {
		name    string
		spoilt  func(Keys) string
		release Release
	}{
		{"the marker, client id alone", Keys.Marker, Release{}},
		{"the marker, every argument", Keys.Marker, Release{Full: true}},
		{"the queue", Keys.Queue, Release{Full: true}},
		{"the fence, behind a token handed out", Keys.Fence, Release{HandedOut: 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			p, k := e.holder()
			key := c.spoilt(k)
			e.spoil(key, k)
			_, err := ReadRelease(e.run(p.Release(k, "k", c.release)))
			require.Error(t, err)
			require.False(t, WrongType(err), "%v", err)
			require.ErrorContains(t, err, key)
			require.Equal(t, p.ClientID(), e.owner(k))
		})
	}
}
