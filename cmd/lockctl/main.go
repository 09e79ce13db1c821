// Command lockctl shows who holds lockreg's locks and forces a stuck one
// open.
//
//	lockctl -redis URL -namespace NS list          # key, owner, live or gone, TTL, token
//	lockctl -redis URL -namespace NS show KEY      # one lock in detail
//	lockctl -redis URL -namespace NS unlock KEY    # asks first on a terminal
//	lockctl unlock KEY -yes -namespace NS          # flags go before or after the command
//	lockctl -namespace NS show -quoted '"job\x00a"' # a key as list prints it
//
// -redis takes a redis:// (or rediss://, unix://) URL, or HOST:PORT, or
// several addresses or URLs separated by commas, which make a Cluster
// client (as -cluster does, and one address of a Cluster node), or
// Sentinels with -sentinel MASTER (the first URL's user and password
// serve the primary, and the Sentinels too if they ask for one). Later
// addresses take the first's user, password, TLS and database, or name
// the same ones. REDIS_URL is the default. -json prints JSON. The namespace is the one the
// service passes to lockreg.New. list, show and the confirmation need only
// read the namespace (the README's inspector ACL); unlock runs
// forceunlock.lua, and forces the key open only while the registry it
// showed holds it: if another registry took the key meanwhile, it says so
// and unlocks nothing. -timeout
// bounds the Redis calls before the confirmation and after it, each.
//
// An owner is live if its registry refreshed its owner hash within the
// last two leases, gone if not (it died, or could not write the hash). A
// namespace in which nothing is held is told apart from one that no
// registry uses: lockctl names the namespaces whose registries it sees,
// the close ones first, so that a mistyped one stands out.
//
// Exit codes: 0 done; 1 an error (Redis unreachable or too slow, a command
// the ACL forbids, an unlock declined, or refused as the key changed
// hands); 2 bad usage (a flag, command or
// URL, or unlock without -yes and no terminal to ask on); 3 not found (no such lock held, or no lock held in the namespace).
// lockctl -h lists them too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/keytext"
	"github.com/lockreg/lockreg/internal/protocol"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
)

// errNotFound marks what lockctl did not find; errUsage, what it was told
// wrong. They set the exit code, and are not printed (see failure).
var (
	errNotFound = errors.New("not found")
	errUsage    = errors.New("bad usage")
)

// failure is an error of a kind, errUsage or errNotFound, that says only
// what went wrong.
type failure struct{ kind, err error }

func (f failure) Error() string   { return f.err.Error() }
func (f failure) Unwrap() []error { return []error{f.kind, f.err} }

func usageError(format string, a ...any) error {
	return failure{errUsage, fmt.Errorf(format, a...)}
}

func notFoundError(format string, a ...any) error {
	return failure{errNotFound, fmt.Errorf(format, a...)}
}

func main() {
	// go-redis logs each failed dial on its own (pool.go), ahead of the
	// error lockctl reports; the error says it all.
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, term.IsTerminal(int(os.Stdin.Fd()))))
}

// quietRedis drops go-redis's own log lines (redis.SetLogger).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

type options struct {
	redisURL, namespace, sentinel string
	cluster, json, yes, quoted    bool
	timeout                       time.Duration
	// redisFrom names where redisURL came from, for errors: -redis,
	// $REDIS_URL or the default.
	redisFrom string
}

// usageLine is the one-line usage that follows an error of usage.
const usageLine = "usage: lockctl -namespace NS [flags] list | show KEY | unlock [-yes] KEY   (lockctl -h for more)"

// helpHead and helpTail frame the flags in lockctl -h.
const helpHead = `lockctl shows who holds lockreg's locks, and forces a stuck one open.

usage: lockctl -namespace NS [flags] COMMAND

commands:
  list          the locks held in the namespace: key, owner, live or gone,
                TTL, fencing token, waiters
  show KEY      one lock in detail
  unlock KEY    force KEY's lock open; asks first on a terminal, -yes does not

Flags go before or after the command; a KEY that begins with '-' goes after
"--". A KEY with a NUL byte, which no shell can pass, or other bytes hard
to type, goes with -quoted, as list prints it: show -quoted '"job\x00a"'.
An owner is live if its registry refreshed its owner hash within the last
two leases (a minute at the default 30s lease), gone if not: it died, or
could not write the hash. Keys over 200 bytes are cut, as in lockreg's
errors (-json prints keys whole; one not UTF-8 also as key_base64).

flags:
`

const helpTail = `
exit codes:
  0  done
  1  an error: Redis unreachable or too slow, a command the ACL forbids,
     an unlock declined, or refused as the key changed hands
  2  bad usage: a flag, command or -redis URL lockctl cannot use, or
     unlock without -yes and no terminal to ask on
  3  not found: the key is not held, or no lock is held in the namespace
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, terminal bool) int {
	var o options
	fs := flag.NewFlagSet("lockctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints the errors, and -h its help
	fs.Usage = func() {}
	fs.StringVar(&o.redisURL, "redis", "", "a redis://, rediss:// or unix:// `URL` or HOST:PORT, or several separated by commas (Cluster, or Sentinels with -sentinel); default $REDIS_URL, else "+defaultRedis)
	fs.StringVar(&o.namespace, "namespace", "", "`NS`, the namespace the service passes to lockreg.New (required)")
	fs.BoolVar(&o.cluster, "cluster", false, "connect to a Redis Cluster (implied by several addresses)")
	fs.StringVar(&o.sentinel, "sentinel", "", "the `MASTER` name: the -redis addresses are Sentinels watching it")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	fs.BoolVar(&o.yes, "yes", false, "unlock without asking")
	fs.BoolVar(&o.quoted, "quoted", false, `KEY is quoted as list prints it, escapes and all ("job\x00a"): for a key no shell can pass`)
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long a command may take")
	args, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, helpHead)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fmt.Fprint(stdout, helpTail)
		return exitOK
	}
	if err == nil {
		o.redisURL, o.redisFrom = redisSource(o.redisURL)
		err = dispatch(ctx, o, args, stdin, stdout, stderr, terminal)
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "lockctl:", err)
		fmt.Fprintln(stderr, usageLine)
		return exitUsage
	case errors.Is(err, errNotFound):
		fmt.Fprintln(stderr, "lockctl:", err)
		return exitNotFound
	default:
		fmt.Fprintln(stderr, "lockctl:", err)
		return exitError
	}
}

// parseArgs parses fs's flags wherever they stand, before the command, after
// it or between its arguments, and returns the others: the command and its
// arguments. After "--" all are arguments (a key that begins with '-').
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			hint := ""
			if strings.HasPrefix(err.Error(), "flag provided but not defined") {
				hint = ` (a key that begins with '-' goes after "--")`
			}
			return nil, usageError("%w%s", err, hint)
		}
		left := fs.Args()
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil
		}
		if len(left) == 0 {
			return rest, nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// defaultRedis is the Redis lockctl asks without -redis or $REDIS_URL.
const defaultRedis = "redis://127.0.0.1:6379"

// redisSource is the Redis to ask, given the value of -redis, and where it
// comes from, for errors. ($REDIS_URL is not -redis's default, which -h
// would print, password and all.)
func redisSource(given string) (url, from string) {
	switch env := os.Getenv("REDIS_URL"); {
	case given != "":
		return given, "-redis"
	case env != "":
		return env, "$REDIS_URL"
	}
	return defaultRedis, "the default -redis"
}

// commands are lockctl's commands, and what each takes.
var commands = []string{"list", "show", "unlock"}

// checkCommand refuses a command lockctl does not know, or the wrong
// arguments for one; it returns the command, and its key if it takes one.
func checkCommand(o options, args []string) (command, key string, err error) {
	if len(args) == 0 {
		return "", "", usageError("name a command: list, show KEY or unlock KEY")
	}
	command, args = args[0], args[1:]
	switch command {
	case "list":
		if len(args) > 0 {
			return "", "", usageError("list takes no arguments (given %s)", quoteAll(args))
		}
	case "show", "unlock":
		switch {
		case len(args) == 0:
			return "", "", usageError("%s needs a KEY", command)
		case len(args) > 1:
			return "", "", usageError("%s takes one KEY (given %d: %s)", command, len(args), quoteAll(args))
		}
		if key, err = keyArgument(args[0], o.quoted); err != nil {
			return "", "", err
		}
	default:
		msg := fmt.Sprintf("unknown command %q; the commands are list, show KEY and unlock KEY", command)
		if close := closeMatches(command, commands); len(close) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", close[0])
		}
		return "", "", usageError("%s", msg)
	}
	switch {
	case o.yes && command != "unlock":
		return "", "", usageError("-yes is for unlock, not %s", command)
	case o.quoted && command == "list":
		return "", "", usageError("-quoted is for show and unlock, not list")
	case o.namespace == "":
		return "", "", usageError("-namespace is required: the namespace the service passes to lockreg.New")
	case protocol.CheckNamespace(o.namespace) != nil: // lockreg.New's check, ahead of the first Redis call
		return "", "", usageError("-namespace: namespace %w", protocol.CheckNamespace(o.namespace))
	case o.timeout <= 0:
		return "", "", usageError("-timeout must be positive (given %v)", o.timeout)
	case o.sentinel != "" && o.cluster:
		return "", "", usageError("-sentinel and -cluster exclude each other: Sentinels serve one primary, a Cluster many")
	}
	return command, key, nil
}

func dispatch(ctx context.Context, o options, args []string, stdin io.Reader, stdout, stderr io.Writer, terminal bool) error {
	command, key, err := checkCommand(o, args)
	if err != nil {
		return err
	}
	client, err := connect(o)
	if err != nil {
		return err
	}
	stepCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	client, err = clusterIfNode(stepCtx, client, o)
	defer client.Close()
	if err != nil {
		return explainRedisError(err, o)
	}
	registry, err := lockreg.New(client, o.namespace, lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return usageError("-namespace: %w", err)
	}
	defer closeBriefly(registry)
	c := commandRun{ctx: stepCtx, again: func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.timeout) }, interrupt: ctx,
		client: client, registry: registry, namespace: o.namespace, p: printer{out: stdout, json: o.json}}
	switch command {
	case "list":
		err = c.list()
	case "show":
		var info lockreg.LockInfo
		if info, err = c.inspectHeld(key); err == nil {
			err = c.p.detail(info)
		}
	default:
		err = c.unlock(key, o.yes, terminal, stdin, stderr)
	}
	return explainRedisError(err, o)
}

// closeWait is how long lockctl waits for its registry to close.
const closeWait = 200 * time.Millisecond

// closeBriefly closes registry, but waits closeWait at most: lockctl holds
// nothing, and exits next. (lockreg's Close can wait 15s, its
// subscriptionCheck, when it races the tracking subscription that New
// starts on a single server: about one run of lockctl in five.)
func closeBriefly(registry *lockreg.Registry) {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = registry.Close()
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
	}
}

// commandRun is what a command runs with.
type commandRun struct {
	// ctx bounds the command's Redis calls by -timeout; again starts
	// another such bound, for calls after a prompt, whose time is the
	// operator's; interrupt ends with the run (Ctrl-C), the prompt too.
	ctx       context.Context
	again     func() (context.Context, context.CancelFunc)
	interrupt context.Context
	client    redis.UniversalClient
	registry  *lockreg.Registry
	namespace string
	p         printer
}

func (c commandRun) list() error {
	var infos []lockreg.LockInfo
	for info, err := range c.registry.Locks(c.ctx) {
		if err != nil {
			return err
		}
		infos = append(infos, info)
	}
	slices.SortFunc(infos, func(a, b lockreg.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	if err := c.p.table(infos); err != nil {
		return err
	}
	if len(infos) == 0 {
		return notFoundError("no locks held in namespace %q; %s", c.namespace, c.namespaceHint(true))
	}
	return nil
}

// inspectHeld inspects key, which must be held.
func (c commandRun) inspectHeld(key string) (lockreg.LockInfo, error) {
	info, err := c.registry.Inspect(c.ctx, key)
	if err == nil && !info.Held {
		err = notFoundError("%s is not held in namespace %q", quoteKey(key), c.namespace)
		if hint := c.namespaceHint(false); hint != "" {
			err = fmt.Errorf("%w; %s", err, hint)
		}
		if looksCut(key) {
			err = fmt.Errorf("%w; list cuts keys over %d bytes: -json prints them whole", err, keytext.Max)
		}
	}
	return info, err
}

// namespaceHint tells a namespace in which nothing was found from one that
// no registry uses (see seenNamespaces); of a namespace that some do, only
// if always.
func (c commandRun) namespaceHint(always bool) string {
	seen, err := seenNamespaces(c.ctx, c.client)
	if err != nil {
		return fmt.Sprintf("could not look for the namespaces in use: %v", err)
	}
	return describeNamespace(c.namespace, seen, always)
}
