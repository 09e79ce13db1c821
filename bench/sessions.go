// S1's timing pass: sessions in which lockreg, a peer, the floor of a
// correct lock and the PING floor take turns cycle by cycle, and the
// bootstrap intervals of the peer's ratio to lockreg and of both to the
// lock floor.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/lockreg/lockreg/bench/contenders"
)

// sessions runs S1 as one session per peer: lockreg, the peer, the
// floor of a correct lock (contenders.LockFloor, on its own client) and
// two PINGs on another connection (the old floor) take turns cycle by
// cycle, in an order shuffled every cycle (see turnOrder), for 2x the
// timing pass each. A cycle lasts a few hundred µs, shorter than the
// bursts of noise on this machine, so all of them meet the same
// conditions; and only those clients are alive, as another library's
// client in the process (rueidis's goroutines) was seen to slow every
// other contender's cycles by about 15%, but not PINGs. Each peer is
// compared with lockreg in its own session (VsLockReg), and both with the
// lock floor there (VsLockFloor, LockRegVsLockFloor); lockreg's own
// figures sum its sessions.
func (e *benchEnv) sessions(ctx context.Context, runs []*contenderRun) {
	i := slices.IndexFunc(runs, func(run *contenderRun) bool { return run.f.Name == contenders.LockReg.Name })
	var base *contenderRun
	if i >= 0 && runs[i].ok() {
		base = runs[i]
	}
	var peers []*contenderRun
	for _, run := range runs {
		if run.ok() && run != base {
			peers = append(peers, run)
		}
	}
	if len(peers) == 0 {
		peers = []*contenderRun{nil} // lockreg beside the floors alone
	}
	var floor, baseTotal, lockFloorTotal time.Duration
	var floorPairs, baseCycles, lockFloorCycles int64
	var baseBlocks [][2]time.Duration // the lock floor's and lockreg's time per block, over all sessions
	for _, peer := range peers {
		// The session's clients, by turn: lockreg, the peer, the lock
		// floor; the PINGs take turn sessionPings.
		session := []*contenderRun{base, peer, nil}
		clients := make([]contenders.Contender, len(session))
		for k, run := range session {
			if run == nil {
				continue
			}
			c, err := run.f.New(e.addr)
			if err == nil {
				defer c.Close()
				_, err = cycleOneKey(ctx, c, pass{d: 20 * time.Millisecond})
			}
			if err != nil {
				run.res.Err = err.Error()
				return
			}
			clients[k] = c
		}
		if c, err := contenders.LockFloor.New(e.addr); err != nil {
			fmt.Fprintln(os.Stderr, "S1 lock floor:", err)
		} else {
			defer c.Close()
			if _, err := cycleOneKey(ctx, c, pass{d: 20 * time.Millisecond}); err != nil {
				fmt.Fprintln(os.Stderr, "S1 lock floor:", err)
			} else {
				clients[sessionLockFloor] = c
			}
		}
		times := make([]time.Duration, len(session))
		var blocks [][3]time.Duration // lockreg's, the peer's and the lock floor's time per block of cycles
		var cycles int64
		var sessionFloor time.Duration
		turns := newTurnOrder(sessionPings + 1)
		for end := time.Now().Add(2 * e.d); time.Now().Before(end); cycles++ {
			if cycles%blockCycles == 0 {
				blocks = append(blocks, [3]time.Duration{})
			}
			for _, k := range turns.next() {
				start := time.Now()
				if k == sessionPings {
					e.admin.Ping(ctx)
					e.admin.Ping(ctx)
					sessionFloor += time.Since(start)
					continue
				}
				if clients[k] == nil {
					continue
				}
				release, err := clients[k].Acquire(ctx, "s1")
				if err == nil {
					err = release(ctx)
				}
				if err != nil {
					if k == sessionLockFloor {
						fmt.Fprintln(os.Stderr, "S1 lock floor:", err)
						clients[k] = nil
						continue
					}
					session[k].res.Err = err.Error()
					return
				}
				took := time.Since(start)
				times[k] += took
				blocks[len(blocks)-1][k] += took
			}
		}
		withLockFloor := clients[sessionLockFloor] != nil
		floor, floorPairs = floor+sessionFloor, floorPairs+cycles
		if base != nil {
			baseTotal, baseCycles = baseTotal+times[0], baseCycles+cycles
			if withLockFloor {
				lockFloorTotal, lockFloorCycles = lockFloorTotal+times[sessionLockFloor], lockFloorCycles+cycles
				baseBlocks = append(baseBlocks, blockPairs(blocks, sessionLockFloor, 0)...)
			}
		}
		if peer != nil {
			peer.timed = load{acquisitions: cycles, ops: cycles, elapsed: times[1]}
			peer.res.FloorNsPerOp = float64(sessionFloor.Nanoseconds()) / float64(cycles)
			if base != nil {
				peer.res.VsLockReg = float64(times[1]) / float64(times[0])
				peer.res.VsLockRegLo, peer.res.VsLockRegHi = ratioInterval(blockPairs(blocks, 0, 1))
			}
			if withLockFloor {
				peer.res.LockFloorNsPerOp = float64(times[sessionLockFloor].Nanoseconds()) / float64(cycles)
				peer.res.VsLockFloor = float64(times[1]) / float64(times[sessionLockFloor])
				peer.res.VsLockFloorLo, peer.res.VsLockFloorHi = ratioInterval(blockPairs(blocks, sessionLockFloor, 1))
				if base != nil {
					peer.res.LockRegVsLockFloor = float64(times[0]) / float64(times[sessionLockFloor])
					peer.res.LockRegVsLockFloorLo, peer.res.LockRegVsLockFloorHi = ratioInterval(blockPairs(blocks, sessionLockFloor, 0))
				}
			}
		}
	}
	if base != nil {
		base.timed = load{acquisitions: baseCycles, ops: baseCycles, elapsed: baseTotal}
		base.res.FloorNsPerOp = float64(floor.Nanoseconds()) / float64(floorPairs)
		if lockFloorTotal > 0 {
			// Over the sessions that timed the lock floor (all, unless it
			// failed).
			var lr time.Duration
			for _, b := range baseBlocks {
				lr += b[1]
			}
			base.res.LockFloorNsPerOp = float64(lockFloorTotal.Nanoseconds()) / float64(lockFloorCycles)
			base.res.VsLockFloor = float64(lr) / float64(lockFloorTotal)
			base.res.VsLockFloorLo, base.res.VsLockFloorHi = ratioInterval(baseBlocks)
		}
	}
}

// An S1 session's turns: lockreg is 0 and the peer 1.
const (
	sessionLockFloor = 2 // the lock floor's turn
	sessionPings     = 3 // the two PINGs' turn
)

// blockPairs returns, for ratioInterval, each block's time of client a and
// of client b: the interval is then of b's time over a's.
func blockPairs(blocks [][3]time.Duration, a, b int) [][2]time.Duration {
	out := make([][2]time.Duration, len(blocks))
	for i, block := range blocks {
		out[i] = [2]time.Duration{block[a], block[b]}
	}
	return out
}

// turnOrder is the order in which an S1 session's clients take their
// turns, cycle after cycle (the last client is the floor's PINGs): shuffled
// every cycle, with a fixed seed, so that every client follows every other
// equally often. What ran just before moves a cycle's time: with a fixed
// rotation, where lockreg followed the PINGs in two cycles of three and
// the peer followed lockreg, a session of two identical lockregs measured
// the second faster in 9 runs of 9 (0.992x-0.9998x), and 0.998x-1.005x
// with the order shuffled (docs/BENCHMARKS.md).
type turnOrder struct {
	rng   *rand.Rand
	order []int
}

func newTurnOrder(clients int) *turnOrder {
	t := &turnOrder{rng: rand.New(rand.NewPCG(3, 4)), order: make([]int, clients)}
	for i := range t.order {
		t.order[i] = i
	}
	return t
}

// next returns the next cycle's order.
func (t *turnOrder) next() []int {
	t.rng.Shuffle(len(t.order), func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })
	return t.order
}

// blockCycles is how many cycles of an S1 session make one block of
// ratioInterval's resampling.
const blockCycles = 250

// ratioInterval is a 95% bootstrap interval of the peer's time over
// lockreg's in one S1 session: blocks of cycles, each lockreg's and the
// peer's time, are resampled with replacement (a fixed seed, so that one
// run's figures can be recomputed). It says how far the ratio would move
// with the noise inside the session; the machine's state between
// sessions is not in it. It returns zeros with too few blocks.
func ratioInterval(blocks [][2]time.Duration) (lo, hi float64) {
	const resamples = 2000
	if len(blocks) < 10 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ratios := make([]float64, resamples)
	for i := range ratios {
		var base, peer time.Duration
		for range blocks {
			b := blocks[rng.IntN(len(blocks))]
			base, peer = base+b[0], peer+b[1]
		}
		ratios[i] = float64(peer) / float64(base)
	}
	slices.Sort(ratios)
	return ratios[resamples*25/1000], ratios[resamples*975/1000-1]
}
