package lockregtest

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2/server"

	"github.com/lockreg/lockreg"
)

// TestLoseNeedsNoSubscription: on a loaded machine the holder's
// subscription, which it opens in the background once it holds a key, may
// take longer than usual; the holder still hears of the forced unlock
// (LossForced) at once, from its own registry, rather than find its key
// gone at its next renewal (LossDeleted).
func TestLoseNeedsNoSubscription(t *testing.T) {
	slow := func(_ *server.Peer, cmd string, _ ...string) bool {
		if cmd == "SUBSCRIBE" {
			time.Sleep(400 * time.Millisecond)
		}
		return false
	}
	r := newEmbedded(t, slow, nil)
	causes := make(chan lockreg.LossCause, 1)
	r.AddHooks(lockreg.Hooks{Lost: func(e lockreg.LossEvent) { causes <- e.Cause }})
	if _, err := r.Obtain("k").Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	Lose(t, r, "k")
	if cause := <-causes; cause != lockreg.LossForced {
		t.Fatalf("the holder was told %v, not %v", cause, lockreg.LossForced)
	}
}
