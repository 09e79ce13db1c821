// Command lockctl shows who holds lockreg's locks and forces a stuck one
// open.
//
//	lockctl -redis URL -namespace NS list          # key, owner, TTL, token
//	lockctl -redis URL -namespace NS show KEY      # one lock in detail
//	lockctl -redis URL -namespace NS unlock KEY    # asks first on a terminal
//	lockctl -redis URL -namespace NS unlock -yes KEY
//
// -redis takes a redis:// (or rediss://) URL, or several addresses or URLs
// separated by commas, which make a Cluster client (as -cluster does), or
// Sentinels with -sentinel MASTER; REDIS_URL is the default. -json prints
// JSON. The namespace is the registryKey the service passes to
// lockreg.New. list, show and the confirmation need only read the
// namespace (the README's inspector ACL); unlock runs forceunlock.lua.
//
// Exit codes: 0 done; 1 an error (Redis unreachable, a command the ACL
// forbids); 2 bad usage (flags, URL); 3 not found (no such lock held, or
// no lock held in the namespace).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/lockreg/lockreg"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
)

// errNotFound marks what lockctl did not find; errUsage, what it was told
// wrong.
var (
	errNotFound = errors.New("not found")
	errUsage    = errors.New("bad usage")
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, term.IsTerminal(int(os.Stdin.Fd()))))
}

type options struct {
	redisURL, namespace, sentinel string
	cluster, json                 bool
	timeout                       time.Duration
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, terminal bool) int {
	var o options
	fs := flag.NewFlagSet("lockctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.redisURL, "redis", envOr("REDIS_URL", "redis://127.0.0.1:6379"), "a redis:// URL, or several addresses or URLs separated by commas (Cluster, or Sentinels with -sentinel); default $REDIS_URL")
	fs.StringVar(&o.namespace, "namespace", "", "the registryKey the service passes to lockreg.New (required)")
	fs.BoolVar(&o.cluster, "cluster", false, "connect to a Redis Cluster (implied by several addresses)")
	fs.StringVar(&o.sentinel, "sentinel", "", "the master name: the -redis addresses are Sentinels watching it")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long a command may take")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: lockctl [flags] list | show KEY | unlock [-yes] KEY")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	err := dispatch(ctx, o, fs.Args(), stdin, stdout, stderr, terminal)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "lockctl:", err)
		fs.Usage()
		return exitUsage
	case errors.Is(err, errNotFound):
		fmt.Fprintln(stderr, "lockctl:", err)
		return exitNotFound
	default:
		fmt.Fprintln(stderr, "lockctl:", err)
		return exitError
	}
}

func dispatch(ctx context.Context, o options, args []string, stdin io.Reader, stdout, stderr io.Writer, terminal bool) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: name a command", errUsage)
	}
	if o.namespace == "" {
		return fmt.Errorf("%w: -namespace is required", errUsage)
	}
	command, args := args[0], args[1:]
	yes := false
	if command == "unlock" {
		sub := flag.NewFlagSet("unlock", flag.ContinueOnError)
		sub.SetOutput(stderr)
		sub.BoolVar(&yes, "yes", false, "do not ask for confirmation")
		if err := sub.Parse(args); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		args = sub.Args()
	}
	switch {
	case command == "list" && len(args) == 0:
	case (command == "show" || command == "unlock") && len(args) == 1:
		if args[0] == "" {
			return fmt.Errorf("%w: the key is empty", errUsage)
		}
	default:
		return fmt.Errorf("%w: %s %s", errUsage, command, strings.Join(args, " "))
	}
	client, err := connect(o)
	if err != nil {
		return err
	}
	defer client.Close()
	registry, err := lockreg.New(client, o.namespace, lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer registry.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	p := printer{out: stdout, json: o.json}
	switch command {
	case "list":
		return list(ctx, registry, o.namespace, p)
	case "show":
		info, err := inspectHeld(ctx, registry, args[0])
		if err != nil {
			return err
		}
		return p.detail(info)
	default:
		return unlock(ctx, registry, args[0], yes, terminal, stdin, stderr, p)
	}
}

func list(ctx context.Context, registry *lockreg.Registry, namespace string, p printer) error {
	var infos []lockreg.LockInfo
	for info, err := range registry.Locks(ctx) {
		if err != nil {
			return err
		}
		infos = append(infos, info)
	}
	if err := p.table(infos); err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("%w: no lock held in namespace %q", errNotFound, namespace)
	}
	return nil
}

// inspectHeld inspects key, which must be held.
func inspectHeld(ctx context.Context, registry *lockreg.Registry, key string) (lockreg.LockInfo, error) {
	info, err := registry.Inspect(ctx, key)
	if err == nil && !info.Held {
		err = fmt.Errorf("%w: %q is not held", errNotFound, key)
	}
	return info, err
}

func unlock(ctx context.Context, registry *lockreg.Registry, key string, yes, terminal bool, stdin io.Reader, stderr io.Writer, p printer) error {
	info, err := inspectHeld(ctx, registry, key)
	if err != nil {
		return err
	}
	if !yes {
		if !terminal {
			return fmt.Errorf("%w: unlock asks for confirmation on a terminal; pass -yes to unlock without asking", errUsage)
		}
		if !confirm(stdin, stderr, info) {
			return errors.New("not unlocked")
		}
	}
	found, err := registry.ForceUnlock(ctx, key)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %q was released meanwhile", errNotFound, key)
	}
	return p.unlocked(info)
}

// confirm asks on a terminal whether to force info's lock open.
func confirm(stdin io.Reader, stderr io.Writer, info lockreg.LockInfo) bool {
	fmt.Fprintf(stderr, "Force %q open? %s holds it for another %v, and may still be working. [y/N] ",
		info.Key, ownerOf(info.Owner, info.OwnerID), info.TTL.Round(time.Millisecond))
	answer, _ := bufio.NewReader(stdin).ReadString('\n')
	answer = strings.ToLower(strings.TrimSpace(answer))
	return answer == "y" || answer == "yes"
}

// connect makes the client o names.
func connect(o options) (redis.UniversalClient, error) {
	var urls []*redis.Options
	for _, part := range strings.Split(o.redisURL, ",") {
		part = strings.TrimSpace(part)
		if !strings.Contains(part, "://") {
			part = "redis://" + part
		}
		opt, err := redis.ParseURL(part)
		if err != nil {
			return nil, fmt.Errorf("%w: -redis %q: %w", errUsage, o.redisURL, err)
		}
		urls = append(urls, opt)
	}
	first := urls[0]
	var addrs []string
	for _, u := range urls {
		addrs = append(addrs, u.Addr)
	}
	switch {
	case o.sentinel != "":
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: o.sentinel, SentinelAddrs: addrs,
			Username: first.Username, Password: first.Password, DB: first.DB, TLSConfig: first.TLSConfig,
		}), nil
	case o.cluster || len(addrs) > 1:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs, Username: first.Username, Password: first.Password, TLSConfig: first.TLSConfig,
		}), nil
	}
	return redis.NewClient(first), nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// printer prints locks as tables or JSON.
type printer struct {
	out  io.Writer
	json bool
}

// lockJSON is a lock as -json prints it.
type lockJSON struct {
	Key     string       `json:"key"`
	Held    bool         `json:"held"`
	Owner   string       `json:"owner"`
	OwnerID string       `json:"owner_id"`
	TTLms   int64        `json:"ttl_ms"`
	Token   int64        `json:"token"`
	Waiting []waiterJSON `json:"waiting"`
}

type waiterJSON struct {
	Owner   string `json:"owner"`
	OwnerID string `json:"owner_id"`
}

func toJSON(info lockreg.LockInfo) lockJSON {
	j := lockJSON{Key: info.Key, Held: info.Held, Owner: info.Owner, OwnerID: info.OwnerID,
		TTLms: info.TTL.Milliseconds(), Token: info.Token, Waiting: []waiterJSON{}}
	for _, w := range info.Waiting {
		j.Waiting = append(j.Waiting, waiterJSON{Owner: w.Owner, OwnerID: w.OwnerID})
	}
	return j
}

func (p printer) table(infos []lockreg.LockInfo) error {
	if p.json {
		all := make([]lockJSON, 0, len(infos))
		for _, info := range infos {
			all = append(all, toJSON(info))
		}
		return json.NewEncoder(p.out).Encode(all)
	}
	if len(infos) == 0 {
		return nil
	}
	w := tabwriter.NewWriter(p.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tOWNER\tTTL\tTOKEN\tWAITING")
	for _, info := range infos {
		fmt.Fprintf(w, "%q\t%s\t%v\t%d\t%d\n", info.Key, ownerOf(info.Owner, info.OwnerID), info.TTL.Round(time.Millisecond), info.Token, len(info.Waiting))
	}
	return w.Flush()
}

func (p printer) detail(info lockreg.LockInfo) error {
	if p.json {
		return json.NewEncoder(p.out).Encode(toJSON(info))
	}
	w := tabwriter.NewWriter(p.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "key\t%q\n", info.Key)
	fmt.Fprintf(w, "owner\t%s\n", ownerOf(info.Owner, info.OwnerID))
	fmt.Fprintf(w, "owner id\t%s\n", info.OwnerID)
	fmt.Fprintf(w, "ttl\t%v\n", info.TTL.Round(time.Millisecond))
	fmt.Fprintf(w, "token\t%d\n", info.Token)
	for i, waiter := range info.Waiting {
		fmt.Fprintf(w, "waiting %d\t%s\n", i+1, ownerOf(waiter.Owner, waiter.OwnerID))
	}
	return w.Flush()
}

func (p printer) unlocked(info lockreg.LockInfo) error {
	if p.json {
		return json.NewEncoder(p.out).Encode(map[string]any{"unlocked": toJSON(info)})
	}
	_, err := fmt.Fprintf(p.out, "unlocked %q, held by %s\n", info.Key, ownerOf(info.Owner, info.OwnerID))
	return err
}

// ownerOf names an owner: by name, or by client id if it has none.
func ownerOf(name, id string) string {
	if name == "" {
		return "(unnamed) " + id
	}
	return name
}
