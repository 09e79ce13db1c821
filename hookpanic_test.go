package lockreg

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestADoneHookThatPanicsLeavesNoOtherHookHalfTold: an AcquireDone hook
// that panics once the key is taken must not keep the hooks after it from
// hearing the acquisition's end (their spans would never end), nor leave
// the hooks before it, told the key was acquired, with a hold that never
// ends for them (lockregotel's lockreg.holds would count it for good): the
// hold, released unclaimed, is a release they are told of.
func TestADoneHookThatPanicsLeavesNoOtherHookHalfTold(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	before, after := &recorder{}, &recorder{}
	r.AddHooks(before.hooks())
	r.AddHooks(Hooks{AcquireDone: func(context.Context, AcquireEvent) { panic("hook") }})
	r.AddHooks(after.hooks())
	require.PanicsWithValue(t, "hook", func() { _, _ = r.Obtain("k").Acquire(ctx) })

	_, acquired, released, _, _ := after.snapshot()
	require.Len(t, acquired, 1, "the hook after the panicking one heard the acquisition end")
	_, acquired, released, _, _ = before.snapshot()
	require.Len(t, acquired, 1)
	require.Equal(t, OutcomeAcquired, acquired[0].Outcome)
	require.Len(t, released, 1, "the hold it heard of was released")
	require.NoError(t, released[0].Err)
	require.Zero(t, client.Exists(ctx, r.Obtain("k").keys().Lock()).Val(), "nothing left held in Redis")
	requireNoLocalState(t, r, "nor here")
}
