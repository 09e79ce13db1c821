//go:build linux

// Command lockcheck checks lockreg's mutual exclusion and fencing under
// faults, on real Redis servers it starts itself: one server, a Sentinel
// group (a primary, a replica, three Sentinels) or a Redis Cluster (three
// primaries with a replica each), as -topology says.
//
// Worker processes (re-executions of this binary), each with one registry
// shared by several goroutines, loop for the run: lock one of the keys,
// increment the key's record in a fenced store (a separate Redis, never
// faulted, that rejects calls with a token lower than one it has seen)
// with a separate read and write, and unlock. Meanwhile lockcheck stops
// and kills holders; kills connections, crashes and restarts the lock
// Redis, pauses it and makes it sleep; stalls, slows down and resets one
// worker's connections through a proxy; kills primaries for their
// replicas to take over; moves held keys' slots; and deletes, overwrites,
// flushes or evicts held keys behind their holders' backs, timing how
// long each holder stays blind to it. The workers stream
// every hold to lockcheck, which then checks the history: no two holds of
// a key whose leases were live overlap (across a failover, every overlap
// must have been reported to the earlier holder), tokens only rise, the
// store rejected every stale call, no increment was lost, no waiter
// starved, and every fault was recovered from. docs/RELIABILITY.md has the
// definitions and long runs' figures.
//
//	go run ./cmd/lockcheck                                        # about 30s
//	go run ./cmd/lockcheck -d 10m                                 # make chaos-single
//	go run ./cmd/lockcheck -topology sentinel -d 60s
//	go run ./cmd/lockcheck -faults net-stall,net-delay,net-reset -d 60s
//	go run ./cmd/lockcheck -faults del,overwrite,flush,evict -d 60s  # make chaos-keys, 10m
//
// It exits 1 on any violation. It runs on Linux only: it relies on
// SIGSTOP and on children that die with it (Pdeathsig).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

type config struct {
	topology    string
	waitReplica int
	d           time.Duration
	keys        []int
	p, g        int
	lease       time.Duration
	retry       time.Duration
	work        time.Duration
	long        float64
	wait        time.Duration
	every       time.Duration
	faults      []string
	seed        uint64
	json        bool
	keysFlag    string        // as given, for the log
	perKeyCount time.Duration // the length of each phase
}

func main() {
	if spec, ok := os.LookupEnv(workerEnv); ok {
		os.Exit(runWorker(spec))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	stderr = &lockedWriter{w: stderr}
	redis.SetLogger(quietRedis{})
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "lockcheck:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "lockcheck: "+format+"\n", a...) }
	phases, err := check(ctx, cfg, stderr, logf)
	if ctx.Err() != nil {
		logf("interrupted; every worker and Redis it started is stopped")
		return 130
	}
	if err != nil {
		logf("%v", err)
		return 1
	}
	total := merge(phases)
	if cfg.json {
		err = writeJSON(stdout, cfg, phases, total)
	} else {
		err = writeTable(stdout, cfg, phases, total)
	}
	if err != nil {
		logf("%v", err)
		return 1
	}
	if total.ViolationCount > 0 {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("lockcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.topology, "topology", topoSingle, "the lock Redis: single, sentinel (a primary, a replica, three Sentinels) or cluster (three primaries with a replica each)")
	fs.IntVar(&cfg.waitReplica, "wait-replicas", 0, "acquisitions wait for this many replicas (WithWaitReplicas, -retry at most); sentinel and cluster only")
	fs.DurationVar(&cfg.d, "d", 30*time.Second, "how long to run, split evenly among the -keys counts")
	fs.StringVar(&cfg.keysFlag, "keys", "1,16", "how many keys the workers choose from; a list runs one phase per count")
	fs.IntVar(&cfg.p, "p", 4, "worker processes")
	fs.IntVar(&cfg.g, "g", 8, "goroutines per worker, sharing its registry")
	fs.DurationVar(&cfg.lease, "lease", 0, "the lock lease (WithExpireAfter); stops, pauses and stalls last 1.5 leases, DEBUG SLEEP half of one (default 1s, 2s on sentinel)")
	fs.DurationVar(&cfg.retry, "retry", 100*time.Millisecond, "the retry interval (WithRetryInterval)")
	fs.DurationVar(&cfg.work, "work", time.Millisecond, "mean pause between a critical section's read and its write")
	fs.Float64Var(&cfg.long, "long", 0, "the share of critical sections that pause 0.5 to 1.5 leases between read and write instead, renewed meanwhile (default 0.001 on sentinel and cluster, 0 on single)")
	fs.DurationVar(&cfg.wait, "wait", 10*time.Second, "an acquisition that waits this long has starved (a violation)")
	fs.DurationVar(&cfg.every, "every", 0, "the interval between faults; a fault also starts a lease after the one before ended at the earliest (default 2.5 leases)")
	faults := fs.String("faults", "", "the faults to inject, in rotation, comma-separated; empty for none. On any topology: stop, kill-9, net-stall, net-delay, net-reset, "+
		"and the key faults del (DEL a held key) and overwrite (SET it to a foreign value, TTL half a lease); on single also client-kill, restart, pause, debug-sleep; "+
		"on single and cluster the key faults flush (FLUSHALL or FLUSHDB, of the primary that holds the key) and evict (the servers get maxmemory and allkeys-lru, and the key's is filled until it evicts a held key; registries then use WithEvictionAllowed); "+
		"on sentinel failover; on cluster cluster-failover, migrate. "+
		"The report gives each key fault's blind time, from the change to the holder's Lost (default: every kind that applies to -topology, but the key faults, and the network faults on single)")
	fs.Uint64Var(&cfg.seed, "seed", 0, "random seed (0: pick one; the report shows it)")
	fs.BoolVar(&cfg.json, "json", false, "print the results as JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q; all settings are flags (see -h)", fs.Arg(0))
	}
	for _, s := range strings.Split(cfg.keysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-keys: %q is not a key count of at least 1", s)
		}
		cfg.keys = append(cfg.keys, n)
	}
	applies, known := topologyFaults[cfg.topology]
	if !known {
		return cfg, fmt.Errorf("-topology: unknown topology %q; it is single, sentinel or cluster", cfg.topology)
	}
	if cfg.lease == 0 {
		cfg.lease = defaultLease[cfg.topology]
	}
	if cfg.every == 0 {
		cfg.every = cfg.lease * 5 / 2
	}
	if !flagSet(fs, "long") {
		cfg.long = defaultLong[cfg.topology]
	}
	cfg.faults = defaultFaults[cfg.topology]
	if flagSet(fs, "faults") {
		cfg.faults = nil
	}
	if *faults != "" {
		for _, s := range strings.Split(*faults, ",") {
			s = strings.TrimSpace(s)
			switch {
			case !slices.Contains(faultKinds, s):
				return cfg, fmt.Errorf("-faults: unknown fault %q; the kinds are %s", s, strings.Join(faultKinds, ","))
			case !slices.Contains(applies, s):
				return cfg, fmt.Errorf("-faults: %s does not apply to -topology %s; these do: %s", s, cfg.topology, strings.Join(applies, ","))
			}
			cfg.faults = append(cfg.faults, s)
		}
	}
	switch {
	case cfg.waitReplica < 0:
		return cfg, fmt.Errorf("-wait-replicas must not be negative")
	case cfg.waitReplica > 0 && cfg.topology == topoSingle:
		return cfg, fmt.Errorf("-wait-replicas needs replicas: use -topology sentinel or cluster")
	case cfg.p < 1 || cfg.g < 1:
		return cfg, fmt.Errorf("-p and -g must be at least 1")
	case cfg.retry <= 0 || cfg.retry >= cfg.lease:
		return cfg, fmt.Errorf("-retry (%v) must be positive and shorter than -lease (%v)", cfg.retry, cfg.lease)
	case cfg.work < 0:
		return cfg, fmt.Errorf("-work must not be negative")
	case cfg.long < 0 || cfg.long > 1:
		return cfg, fmt.Errorf("-long is a share, from 0 to 1")
	case cfg.wait <= 2*stopFor(cfg.lease):
		return cfg, fmt.Errorf("-wait (%v) must be longer than two stops of 1.5 leases (%v): waiting across a fault is fair", cfg.wait, 2*stopFor(cfg.lease))
	case cfg.every < 2*cfg.lease:
		return cfg, fmt.Errorf("-every (%v) must be at least two leases (%v), so that each fault is over and recovered from before the next", cfg.every, 2*cfg.lease)
	}
	cfg.perKeyCount = cfg.d / time.Duration(len(cfg.keys))
	if cfg.perKeyCount < warmup(cfg)+tail(cfg) {
		return cfg, fmt.Errorf("-d (%v) leaves %v per key count, less than the %v a phase needs around its faults", cfg.d, cfg.perKeyCount, warmup(cfg)+tail(cfg))
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	return cfg, nil
}

// defaultLease is the lease unless -lease says otherwise. A forced Sentinel
// failover takes about a second from the kill until the Sentinels name the
// new primary (their INFO to the promoted replica, every second, confirms
// it): with a 1 s lease, every hold from before the kill would have run
// out by then, and the hazard of asynchronous replication, a new primary
// handing a key to a second owner while the first one's lease is live,
// could not occur. A forced cluster failover takes a few hundred
// milliseconds.
var defaultLease = map[string]time.Duration{topoSingle: time.Second, topoSentinel: 2 * time.Second, topoCluster: time.Second}

// defaultLong is the share of long critical sections unless -long says
// otherwise. A failover reaches clients some 100 ms (cluster) to a second
// (Sentinel) after the kill, when a hold of a millisecond or two that was
// live at the kill is long over: without holds that span a failover, a
// second owner could never meet the first, and no overlap across a
// failover could be seen. One in a thousand, of a lease or so, keeps the
// hot key available most of the time.
var defaultLong = map[string]float64{topoSingle: 0, topoSentinel: 0.001, topoCluster: 0.001}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// A phase injects faults only after a warm-up, and none in its tail, which
// leaves time to recover from the last one (a killed holder's key stays
// taken for up to a lease), and, where Redis has replicas, for a failover
// that the Sentinels or the cluster detect by timeout to end (up to about
// 5 s from the kill to the promotion).
func warmup(cfg config) time.Duration { return cfg.lease }
func tail(cfg config) time.Duration {
	d := 2*cfg.lease + time.Second
	if cfg.topology != topoSingle {
		d += 5 * time.Second
	}
	return d
}

// check runs one phase per key count on one lock Redis topology and one
// store Redis, and analyzes each phase's history.
func check(ctx context.Context, cfg config, stderr io.Writer, logf func(string, ...any)) ([]*result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	topo, err := startTopology(cfg.topology)
	if err != nil {
		return nil, err
	}
	defer topo.close()
	storeSrv, err := redistest.Launch()
	if err != nil {
		return nil, err
	}
	defer storeSrv.Shutdown()
	store := redis.NewClient(&redis.Options{Addr: storeSrv.Addr()})
	defer store.Close()
	var admin *redis.Client            // a single server's, for its faults
	var keyAdmin redis.UniversalClient // the lock Redis's, for the key faults
	switch t := topo.(type) {
	case *singleServer:
		admin = redis.NewClient(&redis.Options{Addr: t.srv.Addr(), ReadTimeout: pauseFor(cfg.lease) + 5*time.Second})
		defer admin.Close()
		keyAdmin = admin
	case *sentinelGroup:
		failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: t.g.SentinelAddrs()})
		defer failover.Close()
		keyAdmin = failover
	case *cluster:
		keyAdmin = t.admin
	}
	// The evict fault needs servers that evict from the start (every
	// primary, on a Cluster), which a registry refuses without
	// WithEvictionAllowed: checked once here.
	var evictLimits map[string]int64
	var refused *refusal
	if slices.Contains(cfg.faults, faultEvict) {
		if evictLimits, err = evictingServers(ctx, topo, admin); err != nil {
			return nil, err
		}
		r, err := checkRefusal(ctx, topo, cfg.lease)
		if err != nil {
			return nil, err
		}
		refused = &r
		logf("evict: the lock Redis has maxmemory %v and allkeys-lru; a registry without WithEvictionAllowed: %s", evictLimits, r.said)
	}

	logf("%d workers x %d goroutines, lease %v, keys %s, %v per key count, faults %s, seed %d; %s, store Redis %s",
		cfg.p, cfg.g, cfg.lease, cfg.keysFlag, cfg.perKeyCount, strings.Join(cfg.faults, ","), cfg.seed, topo.describe(), storeSrv.Addr())
	var results []*result
	rotation, failovers := 0, 0
	for n, keys := range cfg.keys {
		ph := &phase{
			cfg: cfg, self: self, stderr: stderr,
			topo: topo, storeAddr: storeSrv.Addr(),
			registry: fmt.Sprintf("lockcheck-k%d", keys),
			procs:    make(map[int]*workerProc),
			routed:   slices.ContainsFunc(cfg.faults, func(k string) bool { return slices.Contains(networkFaults, k) }),
			servers:  serverAddrs(topo),
		}
		if n == 0 {
			ph.refusal = refused
		}
		for i := range keys {
			ph.keys = append(ph.keys, fmt.Sprintf("k%d", i))
		}
		in := &injector{
			ph: ph, topo: topo, admin: admin, kinds: cfg.faults, next: &rotation, failovers: &failovers,
			keyAdmin: keyAdmin, evictLimits: evictLimits,
			rng: rand.New(rand.NewPCG(cfg.seed, uint64(n))),
			log: func(format string, a ...any) { logf("keys=%d: "+format, append([]any{keys}, a...)...) },
		}
		h, err := ph.run(ctx, in, store)
		if err != nil {
			return nil, fmt.Errorf("keys=%d: %w", keys, err)
		}
		res := analyze(h)
		logf("keys=%d: %d acquisitions, %d faults, %d failovers seen, %d violations", keys, res.Acquisitions, len(h.faults), len(h.switches), res.ViolationCount)
		results = append(results, res)
	}
	return results, nil
}
