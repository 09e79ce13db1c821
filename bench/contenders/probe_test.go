package contenders

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestScanMessagesFindsWantedPayloads: RESP2 and RESP3 messages are
// found, several in one read, a payload cut by the read's end judged on
// what arrived, and neither replies nor other payloads count.
func TestScanMessagesFindsWantedPayloads(t *testing.T) {
	for _, tc := range []struct {
		name, read string
		want       bool
	}{
		{"RESP3 grant", ">3\r\n$7\r\nmessage\r\n$4\r\nch:1\r\n$8\r\ng42:id:k\r\n", true},
		{"RESP2 grant", "*3\r\n$7\r\nmessage\r\n$4\r\nch:1\r\n$8\r\ng42:id:k\r\n", true},
		{"a wake-up, then a grant", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nwk\r\n>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\ng1:ab\r\n", true},
		{"a grant cut short", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\ng4", true},
		{"a wake-up", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nwk\r\n", false},
		{"a reply that says message", "$7\r\nmessage\r\n", false},
		{"a reply", "+OK\r\n", false},
	} {
		if got := scanMessages([]byte(tc.read), LockRegGrant); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if !scanMessages([]byte(">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nbaton\r\n"), FloorBaton) {
		t.Errorf("the floor's baton is not found")
	}
}

// TestProbeTimesArmedCallsAndHearsMessages: a call made with armed
// CallTimes is timed, one made disarmed or without them is not; a wanted
// message published to the probed client's subscription is heard, and
// an unwanted one is not.
func TestProbeTimesArmedCallsAndHearsMessages(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	p := NewProbe(FloorBaton)
	client := redis.NewClient(&redis.Options{Addr: addr})
	client.AddHook(p.Hook())
	defer client.Close()
	ctx := context.Background()
	ct := new(CallTimes)
	tctx := WithCallTimes(ctx, ct)

	client.Ping(tctx)
	if sent, replied := ct.Disarm(); sent != 0 || replied != 0 {
		t.Errorf("a call made disarmed was timed: %d, %d", sent, replied)
	}
	ct.Arm()
	before := time.Now().UnixNano()
	client.Ping(tctx)
	client.Ping(ctx)
	sent, replied := ct.Disarm()
	if sent < before || replied < sent || replied > time.Now().UnixNano() {
		t.Errorf("the armed call: sent %d, replied %d, want both after %d, in order", sent, replied, before)
	}

	channel := "probe:" + t.Name()
	sub := client.Subscribe(ctx, channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	publisher := redis.NewClient(&redis.Options{Addr: addr})
	defer publisher.Close()
	publisher.Publish(ctx, channel, "not the baton")
	if _, err := sub.ReceiveMessage(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Heard() != 0 {
		t.Errorf("an unwanted message was heard")
	}
	published := time.Now().UnixNano()
	publisher.Publish(ctx, channel, floorBaton)
	if _, err := sub.ReceiveMessage(ctx); err != nil {
		t.Fatal(err)
	}
	if heard := p.Heard(); heard < published || heard > time.Now().UnixNano() {
		t.Errorf("the baton was heard at %d, published at %d", heard, published)
	}
}

// TestProbedLockRegTellsTheGrant: a lockreg registry probed waits for a
// key that another registry holds; that one's release grants it the key,
// which the probe hears and the hooks name.
func TestProbedLockRegTellsTheGrant(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	p := NewProbe(LockRegGrant)
	grantee, err := NewProbedLockReg(addr, p)
	if err != nil {
		t.Fatal(err)
	}
	defer grantee.Close()
	holder := newContender(t, LockReg)
	key := testKey(t)
	rel := acquire(t, holder, key)
	ct := new(CallTimes)
	ctx, cancel := context.WithTimeout(WithCallTimes(context.Background(), ct), 10*time.Second)
	defer cancel()
	var path string
	var sent, replied int64
	done := make(chan error, 1)
	go func() { // lockreg's holds belong to the goroutine that acquired
		granted, err := grantee.Acquire(ctx, key)
		if err != nil {
			done <- err
			return
		}
		path = ct.TakePath()
		ct.Arm()
		err = granted(ctx)
		sent, replied = ct.Disarm()
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the grantee's attempt fails and marks it as waiting
	released := time.Now().UnixNano()
	release(t, rel)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if path != "grant" {
		t.Errorf("the key was taken by %q, want a grant", path)
	}
	if heard := p.Heard(); heard < released {
		t.Errorf("the grant was heard at %d, before the release at %d", heard, released)
	}
	if sent == 0 || replied < sent {
		t.Errorf("the release's call: sent %d, replied %d", sent, replied)
	}
}
