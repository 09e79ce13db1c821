//go:build linux

package main

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A DEL that deleted nothing, or an overwrite of a key that was not
// there, changed no key: filed as a change, it would excuse any overlap
// around it on that key (acrossKeyChange), as if it had freed the key
// for a second holder, and count as a fault that hit a held key.
func TestAKeyFaultThatFoundNoKeyChangedNothing(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	col := newCollector(history{}, []string{"k"})
	col.add(0, event{E: "enter", G: 0, Key: "k", Token: 1, At: time.Now().UnixNano()})
	ph := &phase{cfg: config{lease: time.Second}, registry: "r", keys: []string{"k"}, col: col,
		procs: map[int]*workerProc{0: {id: 0}}}
	in := &injector{ph: ph, rng: rand.New(rand.NewPCG(1, 2)), keyAdmin: c}
	for _, kind := range []string{faultDel, faultOverwrite} {
		for _, held := range []bool{false, true} {
			if err := c.Del(ctx, lockKey("r", "k")).Err(); err != nil {
				t.Fatal(err)
			}
			if held {
				if err := c.Set(ctx, lockKey("r", "k"), "owner", time.Second).Err(); err != nil {
					t.Fatal(err)
				}
			}
			f, err := in.keyFault(ctx, kind, time.Now().Add(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if held {
				want = 1
			}
			if len(f.changes) != want {
				t.Errorf("%s of a key that was there: %v; %d changes (%s), want %d", kind, held, len(f.changes), f.note, want)
			}
		}
	}
}
