package redistest

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotMigration moves one hash slot of a cluster from the primary that
// serves it to another, live, with the commands redis-cli --cluster
// reshard sends, one step at a time so that a test can act between them:
// BeginSlotMigration marks the slot importing on the target and migrating
// on the source, MoveKey migrates one of its keys, Finish migrates the
// rest and hands the slot to the target on every node.
type SlotMigration struct {
	Slot         int
	From, To     string // the source's and the target's addresses
	fromID, toID string
	addrs        []string
	from, to     *redis.Client
}

// BeginSlotMigration starts moving slot from its primary to the next node
// of addrs (the addresses StartCluster returned).
func BeginSlotMigration(tb testing.TB, addrs []string, slot int) *SlotMigration {
	tb.Helper()
	ctx := context.Background()
	m := &SlotMigration{Slot: slot, addrs: addrs}
	slots, err := nodeClient(tb, addrs[0]).ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: CLUSTER SLOTS: %v", err)
	}
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End {
			m.From, m.fromID = s.Nodes[0].Addr, s.Nodes[0].ID
		}
	}
	i := slices.Index(addrs, m.From)
	if i < 0 {
		tb.Fatalf("redistest: slot %d is served by %q, not by a node of %v", slot, m.From, addrs)
	}
	m.To = addrs[(i+1)%len(addrs)]
	m.from, m.to = nodeClient(tb, m.From), nodeClient(tb, m.To)
	if m.toID, err = m.to.ClusterMyID(ctx).Result(); err != nil {
		tb.Fatalf("redistest: CLUSTER MYID on %s: %v", m.To, err)
	}
	// Importing first: a client sent to the target by the source's ASK
	// must find it ready.
	if err := m.to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.fromID).Err(); err != nil {
		tb.Fatalf("redistest: CLUSTER SETSLOT %d IMPORTING on %s: %v", slot, m.To, err)
	}
	if err := m.from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID).Err(); err != nil {
		tb.Fatalf("redistest: CLUSTER SETSLOT %d MIGRATING on %s: %v", slot, m.From, err)
	}
	return m
}

// MoveKey migrates one key of the slot still on the source to the target
// and returns it, or reports false when none is left.
func (m *SlotMigration) MoveKey(tb testing.TB) (string, bool) {
	tb.Helper()
	ctx := context.Background()
	keys, err := m.from.ClusterGetKeysInSlot(ctx, m.Slot, 1).Result()
	if err != nil {
		tb.Fatalf("redistest: CLUSTER GETKEYSINSLOT %d on %s: %v", m.Slot, m.From, err)
	}
	if len(keys) == 0 {
		return "", false
	}
	host, port, _ := net.SplitHostPort(m.To)
	// A key that expired since it was listed gets NOKEY, not an error.
	if err := m.from.Migrate(ctx, host, port, keys[0], 0, 5*time.Second).Err(); err != nil {
		tb.Fatalf("redistest: MIGRATE %q from %s to %s: %v", keys[0], m.From, m.To, err)
	}
	return keys[0], true
}

// Finish migrates the keys left and assigns the slot to the target on
// every node, the target first, then the source, as the Redis Cluster
// specification orders it.
func (m *SlotMigration) Finish(tb testing.TB) {
	tb.Helper()
	for {
		if _, ok := m.MoveKey(tb); !ok {
			break
		}
	}
	order := []string{m.To, m.From}
	for _, addr := range m.addrs {
		if addr != m.To && addr != m.From {
			order = append(order, addr)
		}
	}
	for _, addr := range order {
		if err := nodeClient(tb, addr).Do(context.Background(), "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER SETSLOT %d NODE on %s: %v", m.Slot, addr, err)
		}
	}
}

func nodeClient(tb testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
