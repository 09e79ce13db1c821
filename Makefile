# make test  - installs redis-server and redis-sentinel if missing
#              (Debian/Ubuntu, as root or with sudo), then vets, checks
#              formatting and runs every test with the race detector against
#              real Redis (single server, Cluster, primary + Sentinels).
#              A fuzz run of the key scheme, 100,000 inputs (about 10s)
#              (make fuzz: 4 million, minutes). Counts, not durations: with
#              -fuzztime as a duration, Go 1.26 can fail a clean run with
#              "context deadline exceeded" (go.dev/issue/75804). Then short
#              runs on Redis 8.0 and Valkey 8.1, fetched from Debian trixie
#              by scripts/servers (SMOKE_TESTS).
# make demo  - the demo, on an in-process Redis (nothing to install).
# make chaos - cmd/lockcheck for 10 minutes on each topology, 10 more with
#              network faults on one server, and 10 more with key faults
#              (held keys deleted, overwritten, flushed, evicted behind
#              their holders' backs, with each holder's blind time): locks
#              under injected faults, checked for overlaps, stale writes and
#              lost increments (docs/RELIABILITY.md). Each run is a target of
#              its own: chaos-single, chaos-sentinel, chaos-cluster,
#              chaos-net, chaos-keys. make test runs the single-server one
#              for 30s, and the network and key ones for 20s each.
# make compat - a registry of the previous release (COMPAT_REV, from git
#              history) and one of this tree take turns on the same keys,
#              in two processes: no overlap, rising tokens, grants both
#              ways (docs/PROTOCOL.md, Compatibility).
# make stress - stress_test.go (build tag stress), with the race detector:
#              registries on one real redis-server take random keys every
#              way the API offers while held keys are deleted, overwritten,
#              forced open and flushed, waits cancelled, registries closed
#              and the server restarted; checked for overlaps no
#              disturbance explains, stale holders never told, and fencing
#              tokens that do not rise. STRESS_SEED (logged, random if
#              unset) replays a run's choices; STRESS_DUR (60s),
#              STRESS_WORKERS (24), STRESS_KEYS (6), STRESS_REGISTRIES (4),
#              STRESS_TIMEOUT (30m, go test's -timeout).
# make trace-acquisition - lists, file by file, the functions whose code
#              one acquisition that ends in a grant runs (its own goroutine's
#              and those it wakes), measured by coverage counters around it
#              (internal/acquisitionpath; #31's files per acquisition).
# make lockctl - builds bin/lockctl, the operators' tool (list, show, unlock).
# make bench - lockreg beside Redisson-style locks and the Go peers, all in
#              one run (bench/): writes bench/RESULTS.md, bench/results/
#              and bench/charts/. BENCH_QUICK=1 for a smoke run.
# make bench-lib - the in-package benchmarks, 10 interleaved runs, summarized
#              by benchstat (the uncontended cycle is timed in pairs with
#              its floor, two PINGs: see x-floor), and once the heap a
#              held lock and a waiting goroutine keep (bench-heap.txt).
# make bench-otel - extra/lockregotel's benchmarks, 10 runs, by benchstat: the
#              uncontended cycle uninstrumented, with metrics, with tracing
#              and with both; their allocations, and their times side by
#              side (x-off).
# make e2e-metrics - the demo with -metrics on real Redis, scraped by a real
#              Prometheus (installed from the OS packages if missing, as
#              make test does Redis), whose HTTP API must return the
#              acquisitions, holds and Redis calls the demo reported
#              (extra/lockregotel/e2e). About 20s.
# make servers - scripts/servers install all: the servers of the matrix,
#              redis-7.0 (the system's, installed as make test does),
#              redis-8.0 and valkey-8.1 (Debian trixie's, run through
#              trixie's own loader and libraries), each in a bin dir under
#              ${XDG_CACHE_HOME:-$HOME/.cache}/lockreg/servers, or
#              LOCKREG_SERVERS_DIR. LOCKREG_SERVER=<name> has the tests and
#              lockcheck run on one of them (internal/redistest).
# make test-servers - on each server of SERVERS in turn, every test with the
#              race detector, and lockcheck for 60s on a single server and
#              60s on a cluster. Long: about 7 minutes a server.

GO ?= go
BENCHSTAT = $(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

# COMPAT_REV is the release that make compat runs beside this tree: the one
# deployed before it.
COMPAT_REV ?= 60a5730
ACQUISITION_DIR ?= $(or $(TMPDIR),/tmp)/lockreg-acquisition

.PHONY: test demo bench bench-lib bench-otel fuzz chaos chaos-single chaos-sentinel chaos-cluster chaos-net chaos-keys compat stress trace-acquisition lockctl e2e-metrics redis-server prometheus

NET_FAULTS = net-stall,net-delay,net-reset
KEY_FAULTS = del,overwrite,flush,evict

# PKGS are the packages of the workspace (go.work): the library's, and
# those of cmd/lockdemo and extra/lockregotel, modules of their own so that
# the library's go.mod needs no OpenTelemetry. bench/ has its own.
PKGS = github.com/lockreg/lockreg/...
MODULES = . cmd/lockdemo extra/lockregotel extra/lockregtest

test: redis-server
	$(GO) vet $(PKGS)
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	@# Each go.mod says what its module needs, and no more: the library's
	@# gains nothing from the others'.
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy -diff) || exit 1; done
	$(GO) test -race -count=1 -parallel 4 $(PKGS)
	$(GO) run ./cmd/lockcheck -d 30s
	$(GO) run ./cmd/lockcheck -faults $(NET_FAULTS) -d 20s
	@# On 1 key and on 16, where local hand-offs abound: a release that hands
	@# off waits for a read of the key after it (docs/RELIABILITY.md, "Keys
	@# changed behind the holder's back").
	$(GO) run ./cmd/lockcheck -faults $(KEY_FAULTS) -d 20s
	$(GO) test -run '^$$' -fuzz '^FuzzRedisKeys$$' -fuzztime 100000x ./internal/protocol
	cd bench && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	@# The comparison harness, as a smoke run, so that it never rots.
	smoke=$$(mktemp -d) && cd bench && BENCH_QUICK=1 $(GO) run . -out "$$smoke" && rm -rf "$$smoke"
	@# Redis 8.0 and Valkey 8.1, from Debian trixie (scripts/servers), a
	@# short run each: the protocol's scripts, the core rules end to end on
	@# one server, Sentinel and Cluster, and the checker. make test-servers
	@# runs everything on each. Of the harness's own tests, only the one
	@# that checks the server is the one named: the smoke tests run its
	@# Sentinel and Cluster on it.
	scripts/servers install redis-8.0 valkey-8.1
	for s in redis-8.0 valkey-8.1; do \
		LOCKREG_SERVER=$$s $(GO) test -race -count=1 ./internal/protocol && \
		LOCKREG_SERVER=$$s $(GO) test -race -count=1 -run '^TestServersAreThoseOfLockregServer$$' ./internal/redistest && \
		LOCKREG_SERVER=$$s $(GO) test -race -count=1 -run '$(SMOKE_TESTS)' . && \
		LOCKREG_SERVER=$$s $(GO) run ./cmd/lockcheck -d 15s || exit 1; \
	done

# One run at a time even under make -j: each is timed, on a shared machine.
.NOTPARALLEL: chaos
chaos: chaos-single chaos-sentinel chaos-cluster chaos-net chaos-keys

chaos-single: redis-server
	$(GO) run ./cmd/lockcheck -d 10m

chaos-sentinel: redis-server
	$(GO) run ./cmd/lockcheck -topology sentinel -d 10m

chaos-cluster: redis-server
	$(GO) run ./cmd/lockcheck -topology cluster -d 10m

chaos-net: redis-server
	$(GO) run ./cmd/lockcheck -faults $(NET_FAULTS) -d 10m

chaos-keys: redis-server
	$(GO) run ./cmd/lockcheck -faults $(KEY_FAULTS) -d 10m

# STRESS_TIMEOUT ends a run that hangs, with every goroutine's stack: raise
# it with STRESS_DUR. -v prints the seed before anything can go wrong.
STRESS_TIMEOUT ?= 30m

stress: redis-server
	$(GO) vet -tags stress .
	$(GO) test -race -tags stress -run '^TestStress$$' -count=1 -v -timeout $(STRESS_TIMEOUT) .

lockctl:
	$(GO) build -o bin/lockctl ./cmd/lockctl

trace-acquisition: redis-server
	rm -rf $(ACQUISITION_DIR) && mkdir -p $(ACQUISITION_DIR)/coverage $(ACQUISITION_DIR)/at-exit
	$(GO) build -cover -covermode=atomic -coverpkg=./... -o $(ACQUISITION_DIR)/acquisitionpath ./internal/acquisitionpath
	GOCOVERDIR=$(ACQUISITION_DIR)/at-exit $(ACQUISITION_DIR)/acquisitionpath $(ACQUISITION_DIR)/coverage

compat: redis-server
	COMPAT_REV=$(COMPAT_REV) $(GO) test -tags compat -run '^TestRollingDeploy$$' -count=1 -v .

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzRedisKeys$$' -fuzztime 4000000x ./internal/protocol

demo:
	$(GO) run ./cmd/lockdemo

bench: redis-server
	cd bench && $(GO) run .

bench-otel: redis-server
	@# As bench-lib: ten runs, one after another, all ways in each.
	for i in 1 2 3 4 5 6 7 8 9 10; do $(GO) test -run '^$$' -bench . -count 1 ./extra/lockregotel || exit 1; done | tee bench-otel.txt
	$(BENCHSTAT) -col /instrumentation -filter '.name:Uncontended' bench-otel.txt
	$(BENCHSTAT) -filter '.name:UncontendedSideBySide' bench-otel.txt
	$(BENCHSTAT) -col /instrumentation -filter '.name:HooksOfACycle' bench-otel.txt

e2e-metrics: redis-server prometheus
	$(GO) run ./extra/lockregotel/e2e

bench-lib: redis-server
	@# One benchmark run at a time, ten times over, so that noise on this
	@# shared machine hits every variant alike.
	for i in 1 2 3 4 5 6 7 8 9 10; do $(GO) test -run '^$$' -bench '^Benchmark(GoroutineID|Reentrant|ReentrantDo|Uncontended|UncontendedWithContext|HoldStyles|ServerTime|HotKey|DistinctKeys|RenewalRound)$$' -count 1 . || exit 1; done | tee bench.txt
	for i in 1 2 3 4 5 6; do $(GO) test -run '^$$' -bench '^BenchmarkContention$$' -benchtime 1x -count 1 . || exit 1; done | tee bench-contention.txt
	$(GO) test -run '^$$' -bench '^Benchmark(HeldLockHeap|WaiterHeap)$$' -benchtime 3x -count 1 . | tee bench-heap.txt
	$(BENCHSTAT) bench.txt
	$(BENCHSTAT) bench-contention.txt
	$(BENCHSTAT) -filter '.name:GoroutineID' -col /impl bench.txt

# SMOKE_TESTS are the library's tests that make test runs on Redis 8.0 and
# Valkey 8.1: the core rules, each once, and the renewal, which is native
# (SET ... IFEQ) on Valkey 8.1.
SMOKE_TESTS = ^(TestRegistriesOfOneNamespaceExclude|TestMutualExclusionStress|TestRegistryWorksWithAMinimalACL|TestRegistryWorksOverRESP2|TestReleaseGrantsTheKeyToTheWaitingRegistry|TestNotificationWakesARemoteWaiterAtOnce|TestTokensIncreaseAcrossRegistries|TestAHolderLearns.*|TestAnEvictingServerIsRefused|TestAPermanentErrorEndsTheAcquisitionAtOnce|TestForceUnlockFreesTheKeyAndTellsTheHolder|TestRedisCluster|TestRedisClusterMutualExclusion|TestFailoverKeepsWorkingAndReportsLostHolds|TestRenewalIsNativeWhereTheServerHasSetIfeq|TestARenewalOnAFullServerKeepsTheHold|TestATrackedRenewal.*|TestARenewalNamesTheCauseAVerifyWould|TestARoundLosesAKeyOfAnotherTypeAsOverwrittenWhateverTheServer|TestAKeyOfAnotherTypeIsLostAloneAsOverwritten|TestARenewalThatFindsTheKeyGoneNamesTheCauseWhateverTheServer|TestLostFiresOnTimeWhileARenewalHangs|TestRedisClusterRenewsInOneRoundTripPerNode)$$

# SERVERS are the servers of make test-servers (scripts/servers names them).
SERVERS = redis-7.0 redis-8.0 valkey-8.1

.PHONY: servers test-servers

servers:
	scripts/servers install all

# One server at a time (one loop, even under make -j).
test-servers: servers
	for s in $(SERVERS); do \
		echo "=== LOCKREG_SERVER=$$s"; \
		LOCKREG_SERVER=$$s $(GO) test -race -count=1 $(PKGS) && \
		LOCKREG_SERVER=$$s $(GO) run ./cmd/lockcheck -d 60s && \
		LOCKREG_SERVER=$$s $(GO) run ./cmd/lockcheck -topology cluster -d 60s || exit 1; \
	done

redis-server:
	@missing=; otherwise="install Redis 6.2 or later (server and sentinel) with your OS's package manager, or set REDIS_SERVER, REDIS_SENTINEL or REDIS_ADDR"; \
	if [ -z "$$REDIS_ADDR" ] && ! command -v "$${REDIS_SERVER:-redis-server}" >/dev/null 2>&1; then missing=" redis-server"; fi; \
	if ! command -v "$${REDIS_SENTINEL:-redis-sentinel}" >/dev/null 2>&1; then missing="$$missing redis-sentinel"; fi; \
	$(APT_INSTALL)

prometheus:
	@missing=; otherwise="install Prometheus with your OS's package manager, or set PROMETHEUS to its path"; \
	if ! command -v "$${PROMETHEUS:-prometheus}" >/dev/null 2>&1; then missing=" prometheus"; fi; \
	$(APT_INSTALL)

# APT_INSTALL ends a recipe that set missing to the packages to install
# (with a space before each), and otherwise to what to do without apt-get:
# it installs them from the OS packages (Debian/Ubuntu), as root or with
# sudo.
define APT_INSTALL
if [ -z "$$missing" ]; then exit 0; fi; \
if ! command -v apt-get >/dev/null 2>&1; then \
	echo "missing:$$missing: $$otherwise"; exit 1; \
fi; \
if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; else \
	echo "missing:$$missing: run 'apt-get install -y$$missing' as root"; exit 1; \
fi; \
echo "installing$$missing from the OS packages"; \
$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null
endef
