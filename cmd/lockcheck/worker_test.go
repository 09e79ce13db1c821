//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestLeaseTrackerExplainsEveryHold runs the library as a worker does, with
// enough goroutines that it pipelines their calls, and checks that the
// tracker sees the obtain behind every hold and the renewals of a hold that
// outlasts a renewal interval. A change in how the library talks to Redis
// that hid them would blind the checker; this fails first.
func TestLeaseTrackerExplainsEveryHold(t *testing.T) {
	const registry, lease = "tracker", 300 * time.Millisecond
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	var buf bytes.Buffer
	out := &emitter{w: bufio.NewWriter(&buf)}
	tracker := newLeaseTracker(registry, append([]string{"long"}, keys...), out)
	client := redistest.Start(t).Client(t, tracker)
	reg, err := lockreg.New(client, registry, lockreg.WithExpireAfter(lease), lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()

	var wg sync.WaitGroup
	wg.Go(func() {
		lock := reg.Obtain("long")
		lock.Lock()
		time.Sleep(2 * lease)
		lock.Unlock()
	})
	for g := range 32 {
		wg.Go(func() {
			for i := range 50 {
				lock := reg.Obtain(keys[(g+i)%len(keys)])
				lock.Lock()
				if _, _, ok := tracker.rootOf(lock.Key(), lock.Token()); !ok {
					t.Errorf("no observed obtain explains %s with token %d (last %d)", lock.Key(), lock.Token(), tracker.lastToken(lock.Key()))
				}
				lock.Unlock()
			}
		})
	}
	wg.Wait()
	_ = reg.Close() // no more events

	renewed := false
	for line := range bytes.Lines(buf.Bytes()) {
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatal(err)
		}
		renewed = renewed || (ev.E == "renew" && ev.Key == "long")
	}
	if !renewed {
		t.Errorf("no renewal seen of a key held for two leases:\n%s", buf.String())
	}
}
