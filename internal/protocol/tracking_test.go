package protocol

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestARenewalOnTheTrackingConnectionKeepsItsKeysTracked: renew.lua sent
// by RenewTracked on a tracking connection (NOLOOP) reads the keys it
// renewed again, in the same step: its own renewal sends the target no
// invalidation, and a change after it is told. Renew, which does not read
// them again, leaves them untracked there, unknown to the registry: the
// read is what keeps them tracked.
func TestARenewalOnTheTrackingConnectionKeepsItsKeysTracked(t *testing.T) {
	for _, c := range []struct {
		name    string
		renew   func(*Peer, []string) Call
		tracked bool
	}{
		{"RenewTracked", (*Peer).RenewTracked, true},
		{"Renew", (*Peer).Renew, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			p, other := e.peer(), e.peer()
			ours, theirs := p.Keys("ours"), p.Keys("theirs")
			e.hold(p, ours)
			e.hold(other, theirs)
			invalidations, conn := e.trackingConnection()
			keys := []string{ours.Lock(), theirs.Lock()}
			for _, key := range keys {
				require.NoError(t, conn.Do(e.ctx, p.Arm(key).Args...).Err(), "armed")
			}

			renewal := c.renew(p, keys)
			RunPipeline(e.ctx, conn, []*Call{&renewal})
			renewed, err := ReadRenew(renewal.Cmd)
			require.NoError(t, err)
			require.Equal(t, []OwnerState{Ours, Other}, renewed)
			_, err = invalidations.ReceiveTimeout(e.ctx, 100*time.Millisecond)
			require.Error(t, err, "no invalidation for the connection's own renewal")

			require.NoError(t, e.client.Del(e.ctx, ours.Lock()).Err())
			msg, err := invalidations.ReceiveTimeout(e.ctx, 200*time.Millisecond)
			if !c.tracked {
				require.Error(t, err, "untracked since the renewal: %v", msg)
				return
			}
			require.NoError(t, err, "a change after the renewal is told")
			changed, ok := ReadInvalidation(msg.(*redis.Message))
			require.True(t, ok)
			require.Equal(t, []string{ours.Lock()}, changed)
		})
	}
}

// A forced unlock publishes its note on the holder's forced-unlock
// channel before the DEL that invalidates the key: the holder's target,
// subscribed to both (TrackingChannels), reads the cause first, so the
// loss names it (forced) rather than deleted.
func TestAForcedUnlockTellsTheHoldersTargetBeforeTheInvalidation(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	target, conn := e.trackingConnection()
	forced := ForcedChannel(e.namespace, holder.ClientID())
	require.Equal(t, []string{InvalidationChannel, forced}, holder.TrackingChannels())
	require.NoError(t, target.Subscribe(e.ctx, forced))
	_, err := target.ReceiveTimeout(e.ctx, time.Second)
	require.NoError(t, err, "subscribed")
	require.NoError(t, conn.Do(e.ctx, holder.Arm(k.Lock()).Args...).Err(), "armed")

	_, held, err := ReadForceUnlock(e.run(e.peer(noGrants).ForceUnlock(k, "k", 1000, 2*time.Second, "")))
	require.NoError(t, err)
	require.True(t, held)
	msg, err := target.ReceiveTimeout(e.ctx, time.Second)
	require.NoError(t, err)
	require.Equal(t, &redis.Message{Channel: forced, Payload: "f" + holder.ClientID() + ":k"}, msg, "the note first")
	msg, err = target.ReceiveTimeout(e.ctx, time.Second)
	require.NoError(t, err)
	changed, ok := ReadInvalidation(msg.(*redis.Message))
	require.True(t, ok, "then the invalidation: %v", msg)
	require.Equal(t, []string{k.Lock()}, changed)
}

// trackingConnection is a registry's pair for the shared server: a RESP2
// target subscribed to the invalidations, and a connection tracking with
// NOLOOP that redirects to it.
func (e *env) trackingConnection() (*redis.PubSub, *redis.Conn) {
	e.t.Helper()
	name := "target-" + uuid.NewString()[:8]
	target := redis.NewClient(&redis.Options{Addr: e.client.Options().Addr, Protocol: 2, ClientName: name})
	e.t.Cleanup(func() { _ = target.Close() })
	invalidations := target.Subscribe(e.ctx, InvalidationChannel)
	e.t.Cleanup(func() { _ = invalidations.Close() })
	_, err := invalidations.ReceiveTimeout(e.ctx, time.Second)
	require.NoError(e.t, err)
	var id int64
	for _, line := range strings.Split(e.client.ClientList(e.ctx).Val(), "\n") {
		if strings.Contains(line, " name="+name+" ") {
			id, err = strconv.ParseInt(strings.TrimPrefix(strings.Fields(line)[0], "id="), 10, 64)
			require.NoError(e.t, err)
		}
	}
	require.NotZero(e.t, id, "the target's id")
	conn := e.client.Conn()
	e.t.Cleanup(func() { _ = conn.Close() })
	require.NoError(e.t, conn.Do(e.ctx, TrackingArgs(id)...).Err())
	return invalidations, conn
}
