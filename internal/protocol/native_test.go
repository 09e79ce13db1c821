package protocol

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// Native commands where they pay (#33, item 2): Valkey 8.1's
// SET key value IFEQ comparison-value against renew.lua, and what a
// native release could be there against release.lua, measured by the
// server's own time (INFO commandstats) and its main thread's CPU time
// (INFO cpu), the variants interleaved in blocks. Run them on Valkey 8.1:
//
//	LOCKREG_SERVER=valkey-8.1 go test -run Native -bench Native -benchtime 2s -count 10 ./internal/protocol
//
// On a server without SET IFEQ (Redis before 8.4, Valkey before 8.1) the
// test logs the server's error and the renewal benchmarks skip.

// nativeLease is the lease the benchmarks renew to, in ms.
const nativeLease = "30000"

// setIfEqArgs is SET <lock> <id> IFEQ <id> [extra...]: the owner-checked
// SET of Valkey 8.1 and Redis 8.4.
func setIfEqArgs(lock, id string, extra ...any) []any {
	return append([]any{"set", lock, id, "ifeq", id}, extra...)
}

// setIfEqRefused is the server's error for SET IFEQ, or nil if it takes
// it.
func setIfEqRefused(ctx context.Context, client *redis.Client) error {
	key := "native-probe:" + uuid.NewString()
	err := client.Do(ctx, setIfEqArgs(key, "x", "px", "1000")...).Err()
	if err == redis.Nil { // the key is missing: SET IFEQ sets nothing
		return nil
	}
	return err
}

// serverName is the server's name and version, from INFO server.
func serverName(ctx context.Context, client *redis.Client) string {
	info := client.Info(ctx, "server").Val()
	fields := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			fields[k] = v
		}
	}
	if fields["server_name"] == "valkey" {
		return "valkey " + fields["valkey_version"]
	}
	return "redis " + fields["redis_version"]
}

// TestNativeCommandsOfTheServer says which of the native owner-checked
// commands the server has (SET IFEQ; DELIFEQ, Valkey 9.0's; DELEX, Redis
// 8.4's) and, where SET IFEQ is there, checks it against the rules a
// renewal keeps (docs/PROTOCOL.md): the owner check, no resurrection of an
// expired key, and a reply that tells renewed or not.
func TestNativeCommandsOfTheServer(t *testing.T) {
	e := newEnv(t)
	t.Logf("server: %s", serverName(e.ctx, e.client))
	for _, name := range []string{"delifeq", "delex", "getdel"} {
		info, err := e.client.Do(e.ctx, "command", "info", name).Slice()
		require.NoError(t, err)
		require.Len(t, info, 1)
		t.Logf("COMMAND INFO %s: present %v", strings.ToUpper(name), info[0] != nil)
	}
	if err := setIfEqRefused(e.ctx, e.client); err != nil {
		t.Logf("SET ... IFEQ refused: %v", err)
		var reply redis.Error // a reply of the server's, not a failed call
		require.ErrorAs(t, err, &reply)
		require.True(t, NativeRenewalRefused(err), "the refusal that turns a registry back to renew.lua")
		return
	}
	t.Log("SET ... IFEQ: supported")

	p, k := e.holder()
	id := p.ClientID()
	set := func(lock, value string, extra ...any) *redis.Cmd {
		return e.client.Do(e.ctx, setIfEqArgs(lock, value, extra...)...)
	}
	shorten := func(lock string) {
		require.NoError(t, e.client.PExpire(e.ctx, lock, time.Second).Err())
	}

	t.Run("ours: OK, the lease set anew, the value kept", func(t *testing.T) {
		shorten(k.Lock())
		require.Equal(t, "OK", set(k.Lock(), id, "px", ms(testLease)).Val())
		require.Greater(t, e.pttl(k.Lock()), testLease-time.Second)
		require.Equal(t, id, e.owner(k))
	})
	t.Run("another owner's: nil, the key untouched", func(t *testing.T) {
		shorten(k.Lock())
		other := e.peer().ClientID()
		require.Equal(t, redis.Nil, set(k.Lock(), other, "px", ms(testLease)).Err())
		require.Equal(t, id, e.owner(k))
		require.LessOrEqual(t, e.pttl(k.Lock()), time.Second)
	})
	t.Run("gone: nil, nothing created", func(t *testing.T) {
		gone := p.Keys("gone").Lock()
		require.Equal(t, redis.Nil, set(gone, id, "px", ms(testLease)).Err())
		require.Zero(t, e.client.Exists(e.ctx, gone).Val())
	})
	t.Run("expired, not yet reclaimed: nil, not resurrected", func(t *testing.T) {
		// With active expiry off, the key is surely still in memory,
		// expired, when SET IFEQ looks it up.
		if err := e.client.Do(e.ctx, "debug", "set-active-expire", "0").Err(); err == nil {
			defer e.client.Do(context.Background(), "debug", "set-active-expire", "1")
		} else {
			t.Logf("DEBUG SET-ACTIVE-EXPIRE: %v", err)
		}
		expired := p.Keys("expired").Lock()
		require.NoError(t, e.client.Set(e.ctx, expired, id, time.Millisecond).Err())
		time.Sleep(5 * time.Millisecond)
		require.Equal(t, redis.Nil, set(expired, id, "px", ms(testLease)).Err())
		require.Zero(t, e.client.Exists(e.ctx, expired).Val())
	})
	t.Run("GET: the old value whether it matched or not", func(t *testing.T) {
		require.Equal(t, id, set(k.Lock(), id, "px", ms(testLease), "get").Val())
		require.Equal(t, id, set(k.Lock(), "other", "px", ms(testLease), "get").Val())
		require.Equal(t, id, e.owner(k))
		require.Equal(t, redis.Nil, set(p.Keys("gone").Lock(), id, "px", ms(testLease), "get").Err())
	})
	t.Run("KEEPTTL: the lease is not extended", func(t *testing.T) {
		shorten(k.Lock())
		require.Equal(t, "OK", set(k.Lock(), id, "keepttl").Val())
		require.LessOrEqual(t, e.pttl(k.Lock()), time.Second)
	})
	t.Run("NX and XX do not go with IFEQ", func(t *testing.T) {
		for _, flag := range []string{"nx", "xx"} {
			err := set(k.Lock(), id, "px", ms(testLease), flag).Err()
			require.Error(t, err)
			require.NotEqual(t, redis.Nil, err)
			t.Logf("%s: %v", flag, err)
		}
	})
	t.Run("not a string: WRONGTYPE, as renew.lua's GET", func(t *testing.T) {
		hash := p.Keys("hash").Lock()
		require.NoError(t, e.client.HSet(e.ctx, hash, "f", "v").Err())
		err := set(hash, id, "px", ms(testLease)).Err()
		require.True(t, redis.HasErrorPrefix(err, "WRONGTYPE"), err)
		require.Error(t, e.run(p.Renew([]string{hash})).Err())
	})
}

// nativeVariant is one way of doing an operation, run in blocks beside
// the others.
type nativeVariant struct {
	name string
	// names are the commands (commandstats' names) whose server time is
	// the operation's: those the client sends, not those a script or
	// EXEC runs, which count inside theirs.
	names []string
	// cycleNames, if any, are those of a whole cycle (the SET NX PX that
	// takes the key as well).
	cycleNames []string
	op         func()
}

// nativeBench runs block operations of each variant in turn, the first
// variant of each round rotating, and reports per operation each
// variant's server time (commandstats, -µs/op), its cycle's if it has
// cycleNames (-cycle-µs/op), and the main thread's CPU time (-cpu-µs/op,
// with an empty block's, an INFO cpu's, taken off: info-cpu-µs/op), and
// each variant's ratio to the first's (<name>/<first>, -cpu).
func nativeBench(b *testing.B, client *redis.Client, block int, variants []nativeVariant) {
	ctx := context.Background()
	micros := func(names []string) int64 {
		us, err := redisstat.CommandMicros(ctx, client, names...)
		if err != nil {
			b.Fatal(err)
		}
		return us
	}
	type sample struct{ us, cycleUs, cpuUs int64 }
	// commands reads v's server time so far; the CPU time is read after
	// it before a block and before it after one, so that a block's CPU
	// time holds its operations and one INFO cpu, as an empty block's.
	commands := func(v *nativeVariant, s *sample) {
		s.us = micros(v.names)
		if v.cycleNames != nil {
			s.cycleUs = micros(v.cycleNames)
		}
	}
	for _, v := range variants {
		v.op() // loads the scripts
	}
	spent := make([]sample, len(variants))
	var idle int64 // empty blocks' CPU time
	rounds := 0
	for b.Loop() {
		start := mainThreadMicros(b, client)
		idle += mainThreadMicros(b, client) - start
		for i := range variants {
			v := &variants[(i+rounds)%len(variants)]
			var before, after sample
			commands(v, &before)
			before.cpuUs = mainThreadMicros(b, client)
			for range block {
				v.op()
			}
			after.cpuUs = mainThreadMicros(b, client)
			commands(v, &after)
			s := &spent[(i+rounds)%len(variants)]
			s.us += after.us - before.us
			s.cycleUs += after.cycleUs - before.cycleUs
			s.cpuUs += after.cpuUs - before.cpuUs
		}
		rounds++
	}
	ops := float64(rounds * block)
	idleOp := float64(idle) / ops
	b.ReportMetric(idleOp, "info-cpu-µs/op")
	per := make([]sample, len(variants))
	cpu := make([]float64, len(variants))
	for i, v := range variants {
		s := spent[i]
		b.ReportMetric(float64(s.us)/ops, v.name+"-µs/op")
		if v.cycleNames != nil {
			b.ReportMetric(float64(s.cycleUs)/ops, v.name+"-cycle-µs/op")
		}
		cpu[i] = float64(s.cpuUs)/ops - idleOp
		b.ReportMetric(cpu[i], v.name+"-cpu-µs/op")
		per[i] = s
	}
	base := variants[0].name
	for i, v := range variants[1:] {
		b.ReportMetric(float64(per[i+1].us)/float64(per[0].us), v.name+"/"+base)
		b.ReportMetric(cpu[i+1]/cpu[0], v.name+"/"+base+"-cpu")
	}
}

// mainThreadMicros is the server's main thread's CPU time so far, user and
// system, in µs (INFO cpu): what the thread that runs the commands spent,
// reading and writing them included, which commandstats leaves out.
func mainThreadMicros(b *testing.B, client *redis.Client) int64 {
	info, err := client.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || (name != "used_cpu_user_main_thread" && name != "used_cpu_sys_main_thread") {
			continue
		}
		seconds, err := strconv.ParseFloat(value, 64)
		if err != nil {
			b.Fatal(err)
		}
		total += seconds
		found++
	}
	if found != 2 {
		b.Fatalf("INFO cpu has no main thread's times: %q", info)
	}
	return int64(total * 1e6)
}

// nativePeer is a registry of a namespace of the benchmark's own, as
// newEnv's peers, with nativeLease.
func nativePeer(b *testing.B) (*redis.Client, *Peer) {
	client := redistest.Shared(b).Client(b)
	lease, _ := strconv.Atoi(nativeLease)
	p := NewPeer(loadScripts(b), Config{
		Namespace: b.Name() + ":" + uuid.NewString()[:8], ClientID: uuid.NewString(),
		Lease: time.Duration(lease) * time.Millisecond, RetryInterval: testRetry, GrantLease: testGrantLease, Notify: true,
		Owner: "owner of " + b.Name(), OwnerTTL: testOwnerTTL, Since: time.Now(),
	})
	return client, p
}

// needSetIfEq skips the benchmark on a server without SET IFEQ.
func needSetIfEq(b *testing.B, client *redis.Client) {
	if err := setIfEqRefused(context.Background(), client); err != nil {
		b.Skipf("%s: SET ... IFEQ refused: %v", serverName(context.Background(), client), err)
	}
}

// BenchmarkNativeRenew renews one held key: renew.lua as a renewal round
// sends it (EVALSHA, one key) against SET <lock> <id> IFEQ <id> PX
// <lease>, with GET (the old value back) and, for reference, KEEPTTL
// (the owner check alone: no renewal).
func BenchmarkNativeRenew(b *testing.B) {
	ctx := context.Background()
	client, p := nativePeer(b)
	needSetIfEq(b, client)
	k := p.Keys("k")
	require.NoError(b, client.Set(ctx, k.Lock(), p.ClientID(), time.Minute).Err())
	lua := p.Renew([]string{k.Lock()})
	native := func(reply string, extra ...any) func() {
		args := setIfEqArgs(k.Lock(), p.ClientID(), extra...)
		return func() {
			if got, err := client.Do(ctx, args...).Text(); got != reply || err != nil {
				b.Fatalf("%v: %q, %v", args, got, err)
			}
		}
	}
	nativeBench(b, client, 200, []nativeVariant{
		{name: "lua", names: []string{"evalsha", "eval"}, op: func() {
			c := lua
			Run(ctx, client, &c)
			if ok, err := ReadRenew(c.Cmd); err != nil || len(ok) != 1 || ok[0] != Ours {
				b.Fatalf("renew.lua: %v, %v", ok, err)
			}
		}},
		{name: "ifeq", names: []string{"set"}, op: native("OK", "px", nativeLease)},
		{name: "ifeq-get", names: []string{"set"}, op: native(p.ClientID(), "px", nativeLease, "get")},
		{name: "ifeq-keepttl", names: []string{"set"}, op: native("OK", "keepttl")},
	})
}

// BenchmarkNativeRenewBatch renews 100 held keys, a renewal round's batch:
// one renew.lua call with the 100 keys against 100 SET IFEQ PX in one
// pipeline. Per operation: per batch of 100.
func BenchmarkNativeRenewBatch(b *testing.B) {
	ctx := context.Background()
	client, p := nativePeer(b)
	needSetIfEq(b, client)
	const keys = 100
	locks := make([]string, keys)
	sets := make([]*Call, keys)
	for i := range locks {
		locks[i] = p.Keys("k" + strconv.Itoa(i)).Lock()
		require.NoError(b, client.Set(ctx, locks[i], p.ClientID(), time.Minute).Err())
		sets[i] = &Call{Args: setIfEqArgs(locks[i], p.ClientID(), "px", nativeLease)}
	}
	lua := p.Renew(locks)
	nativeBench(b, client, 10, []nativeVariant{
		{name: "lua", names: []string{"evalsha", "eval"}, op: func() {
			c := lua
			Run(ctx, client, &c)
			ok, err := ReadRenew(c.Cmd)
			if err != nil || len(ok) != keys {
				b.Fatalf("renew.lua: %v, %v", ok, err)
			}
			for _, renewed := range ok {
				if renewed != Ours {
					b.Fatalf("renew.lua: %v", ok)
				}
			}
		}},
		{name: "ifeq", names: []string{"set"}, op: func() {
			RunPipeline(ctx, client, sets)
			for _, c := range sets {
				if got, err := c.Cmd.Text(); got != "OK" || err != nil {
					b.Fatalf("%v: %q, %v", c.Args, got, err)
				}
			}
		}},
	})
}

// BenchmarkNativeRelease is the uncontended cycle, the plain SET NX PX
// that takes the free key and a release with nobody waiting: release.lua
// with the client id alone (lockreg's), against the owner-checked release
// a server without DELIFEQ allows with plain commands, WATCH and GET then
// MULTI, DEL, EXEC on one connection (two round trips), and a bare DEL (no
// owner check: the floor of any release, not a candidate). -µs/op is the
// release's server time, -cycle-µs/op the cycle's, -cpu-µs/op the main
// thread's for the cycle.
func BenchmarkNativeRelease(b *testing.B) {
	ctx := context.Background()
	client, p := nativePeer(b)
	k := p.Keys("k")
	take := func() {
		held, err := ReadSetIfFree(client.Do(ctx, p.SetIfFree(k).Args...))
		if err != nil || !held {
			b.Fatalf("SET NX PX: %v, %v", held, err)
		}
	}
	conn := client.Conn()
	b.Cleanup(func() { _ = conn.Close() })
	nativeBench(b, client, 200, []nativeVariant{
		{name: "lua", names: []string{"evalsha", "eval"}, cycleNames: []string{"set", "evalsha", "eval"}, op: func() {
			take()
			c := p.Release(k, "k", Release{})
			Run(ctx, client, &c)
			if found, err := ReadRelease(c.Cmd); err != nil || found.Outcome != Deleted {
				b.Fatalf("release.lua: %+v, %v", found, err)
			}
		}},
		{name: "watch", names: []string{"watch", "get", "multi", "exec", "unwatch"}, cycleNames: []string{"set", "watch", "get", "multi", "exec", "unwatch"}, op: func() {
			take()
			var get *redis.StringCmd
			if _, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Do(ctx, "watch", k.Lock())
				get = pipe.Get(ctx, k.Lock())
				return nil
			}); err != nil || get.Val() != p.ClientID() {
				b.Fatalf("WATCH, GET: %v, %v", get.Val(), err)
			}
			var del *redis.IntCmd
			if _, err := conn.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				del = pipe.Del(ctx, k.Lock())
				return nil
			}); err != nil || del.Val() != 1 {
				b.Fatalf("MULTI, DEL, EXEC: %v, %v", del.Val(), err)
			}
		}},
		{name: "del", names: []string{"del"}, cycleNames: []string{"set", "del"}, op: func() {
			take()
			if n, err := client.Del(ctx, k.Lock()).Result(); n != 1 || err != nil {
				b.Fatalf("DEL: %v, %v", n, err)
			}
		}},
	})
}
