package redistest

import (
	"context"
	"fmt"
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
	clients      map[string]*redis.Client // by address
}

// BeginSlotMigration starts moving slot from its primary to the next node
// of addrs (the addresses StartCluster returned).
func BeginSlotMigration(tb testing.TB, addrs []string, slot int) *SlotMigration {
	tb.Helper()
	m, err := StartSlotMigration(addrs, slot)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Close)
	return m
}

// StartSlotMigration is BeginSlotMigration outside of a test: addrs are
// the cluster's primaries. Close closes its connections.
func StartSlotMigration(addrs []string, slot int) (*SlotMigration, error) {
	ctx := context.Background()
	m := &SlotMigration{Slot: slot, addrs: addrs, clients: make(map[string]*redis.Client)}
	slots, err := m.client(addrs[0]).ClusterSlots(ctx).Result()
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("redistest: CLUSTER SLOTS: %w", err)
	}
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End {
			m.From, m.fromID = s.Nodes[0].Addr, s.Nodes[0].ID
		}
	}
	i := slices.Index(addrs, m.From)
	if i < 0 {
		m.Close()
		return nil, fmt.Errorf("redistest: slot %d is served by %q, not by a node of %v", slot, m.From, addrs)
	}
	m.To = addrs[(i+1)%len(addrs)]
	if m.toID, err = m.client(m.To).ClusterMyID(ctx).Result(); err != nil {
		m.Close()
		return nil, fmt.Errorf("redistest: CLUSTER MYID on %s: %w", m.To, err)
	}
	// Importing first: a client sent to the target by the source's ASK
	// must find it ready.
	if err := m.client(m.To).Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.fromID).Err(); err != nil {
		m.Close()
		return nil, fmt.Errorf("redistest: CLUSTER SETSLOT %d IMPORTING on %s: %w", slot, m.To, err)
	}
	if err := m.client(m.From).Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID).Err(); err != nil {
		m.Close()
		return nil, fmt.Errorf("redistest: CLUSTER SETSLOT %d MIGRATING on %s: %w", slot, m.From, err)
	}
	return m, nil
}

// MoveKey migrates one key of the slot still on the source to the target
// and returns it, or reports false when none is left.
func (m *SlotMigration) MoveKey(tb testing.TB) (string, bool) {
	tb.Helper()
	key, ok, err := m.Move()
	if err != nil {
		tb.Fatal(err)
	}
	return key, ok
}

// Move is MoveKey outside of a test.
func (m *SlotMigration) Move() (string, bool, error) {
	ctx := context.Background()
	keys, err := m.client(m.From).ClusterGetKeysInSlot(ctx, m.Slot, 1).Result()
	if err != nil {
		return "", false, fmt.Errorf("redistest: CLUSTER GETKEYSINSLOT %d on %s: %w", m.Slot, m.From, err)
	}
	if len(keys) == 0 {
		return "", false, nil
	}
	return keys[0], true, m.migrate(keys[0])
}

// MoveThisKey migrates key, of the slot, to the target: a test that must
// split the slot a given way moves the key it names.
func (m *SlotMigration) MoveThisKey(tb testing.TB, key string) {
	tb.Helper()
	if err := m.migrate(key); err != nil {
		tb.Fatal(err)
	}
}

func (m *SlotMigration) migrate(key string) error {
	host, port, _ := net.SplitHostPort(m.To)
	// A key that expired since it was listed gets NOKEY, not an error.
	if err := m.client(m.From).Migrate(context.Background(), host, port, key, 0, 5*time.Second).Err(); err != nil {
		return fmt.Errorf("redistest: MIGRATE %q from %s to %s: %w", key, m.From, m.To, err)
	}
	return nil
}

// Finish migrates the keys left and assigns the slot to the target on
// every node, the target first, then the source, as the Redis Cluster
// specification orders it.
func (m *SlotMigration) Finish(tb testing.TB) {
	tb.Helper()
	if err := m.Complete(); err != nil {
		tb.Fatal(err)
	}
}

// Complete is Finish outside of a test.
func (m *SlotMigration) Complete() error {
	for {
		_, ok, err := m.Move()
		if err != nil {
			return err
		}
		if !ok {
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
		if err := m.client(addr).Do(context.Background(), "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER SETSLOT %d NODE on %s: %w", m.Slot, addr, err)
		}
	}
	return nil
}

// Close closes the migration's connections.
func (m *SlotMigration) Close() {
	for _, c := range m.clients {
		_ = c.Close()
	}
}

func (m *SlotMigration) client(addr string) *redis.Client {
	c, ok := m.clients[addr]
	if !ok {
		c = redis.NewClient(&redis.Options{Addr: addr})
		m.clients[addr] = c
	}
	return c
}
