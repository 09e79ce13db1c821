//go:build linux

package main

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// The watcher files a replica's promotion once the primary it replaced
// stops being one: until then, that primary may still take writes that
// the new one never gets.
func TestWatcherFilesPromotions(t *testing.T) {
	ctx := context.Background()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	col := newCollector(history{}, []string{"k"})
	topo := &sentinelGroup{g: &redistest.SentinelGroup{Primary: primary, Replica: replica}}
	watching, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		newWatcher(topo, []string{"k"}, col).run(watching)
	}()
	defer func() { stop(); <-done }()
	time.Sleep(3 * watchEvery) // its first looks see the roles as they are

	before := time.Now().UnixNano()
	if err := replica.Client(t).SlaveOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * watchEvery)
	if s := col.history().switches; len(s) != 0 {
		t.Fatalf("filed %+v while the old primary was still one", s)
	}
	host, port, _ := net.SplitHostPort(replica.Addr())
	if err := primary.Client(t).SlaveOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(col.history().switches) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no switch filed after the old primary turned replica")
		}
		time.Sleep(watchEvery)
	}
	s := col.history().switches[0]
	if s.server != replica.Addr() || !slices.Equal(s.keys, []string{"k"}) || s.at < before || s.at <= s.since || s.until < s.at {
		t.Errorf("switch %+v (since +%v, at +%v, until +%v); want %s's, with k, since < at <= until", s,
			time.Duration(s.since-before), time.Duration(s.at-before), time.Duration(s.until-before), replica.Addr())
	}
}
