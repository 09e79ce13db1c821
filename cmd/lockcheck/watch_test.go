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
	col := newCollector(History{}, []string{"k"})
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
	if s := col.history().Switches; len(s) != 0 {
		t.Fatalf("filed %+v while the old primary was still one", s)
	}
	host, port, _ := net.SplitHostPort(replica.Addr())
	if err := primary.Client(t).SlaveOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(col.history().Switches) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no switch filed after the old primary turned replica")
		}
		time.Sleep(watchEvery)
	}
	s := col.history().Switches[0]
	if s.Server != replica.Addr() || !slices.Equal(s.Keys, []string{"k"}) || s.At < before || s.At <= s.Since || s.Until < s.At {
		t.Errorf("switch %+v (since +%v, at +%v, until +%v); want %s's, with k, since < at <= until", s,
			time.Duration(s.Since-before), time.Duration(s.At-before), time.Duration(s.Until-before), replica.Addr())
	}
}
