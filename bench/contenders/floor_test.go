package contenders

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestHandoffFloorPassesOneBatonBetweenProcesses: instances standing for
// three processes, four goroutines each, never hold at once; the baton
// visits every process, passed on after floorLocalTurns holds in a row
// while others wait; it reaches the last process still running however
// the others finish; and Close ends the instances' goroutines.
func TestHandoffFloorPassesOneBatonBetweenProcesses(t *testing.T) {
	const procs, goroutines = 3, 4
	addr := redistest.Shared(t).Addr()
	base := settledGoroutines(0)
	instances := make([]Contender, procs)
	for p := range instances {
		c, err := NewHandoffFloor(addr, t.Name(), p, procs)
		if err != nil {
			t.Fatal(err)
		}
		instances[p] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		inside, overlaps atomic.Int32
		mu               sync.Mutex
		order            []int // the process of each hold, in the order held
		wg               sync.WaitGroup
	)
	for p, c := range instances {
		holds := 40 * (p + 1) // process 0 finishes first, process 2 last
		for range goroutines {
			wg.Go(func() {
				for range holds / goroutines {
					release, err := c.Acquire(ctx, "")
					if err != nil {
						t.Errorf("process %d: Acquire: %v", p, err)
						return
					}
					if !inside.CompareAndSwap(0, 1) {
						overlaps.Add(1)
					}
					mu.Lock()
					order = append(order, p)
					mu.Unlock()
					time.Sleep(50 * time.Microsecond)
					inside.Store(0)
					if err := release(ctx); err != nil {
						t.Errorf("process %d: release: %v", p, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d holds overlapped another", n)
	}
	if got, want := len(order), 40*(1+2+3); got != want {
		t.Fatalf("%d holds, want %d", got, want)
	}
	held := make([]int, procs)
	run, othersWait := 0, true // until process 0's last hold, every process has goroutines waiting
	for i, p := range order {
		held[p]++
		if i > 0 && p == order[i-1] {
			run++
		} else {
			run = 1
		}
		if othersWait && run > floorLocalTurns {
			t.Fatalf("process %d held %d times in a row at hold %d while others waited, want at most %d", p, run, i, floorLocalTurns)
		}
		othersWait = othersWait && held[0] < 40
	}
	for p, n := range held {
		if n != 40*(p+1) {
			t.Errorf("process %d held %d times, want %d", p, n, 40*(p+1))
		}
	}
	for _, c := range instances {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if n := settledGoroutines(base + 2); n > base+2 {
		t.Errorf("%d goroutines after Close, %d before", n, base)
	}
}
