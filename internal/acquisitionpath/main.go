// Command acquisitionpath lists the code that one acquisition ending in a
// grant runs: the measure of #31's "files one acquisition passes
// through". `make trace-acquisition` builds it with coverage (it needs
// -cover -covermode=atomic, and -coverpkg naming lockreg's packages and
// this one) and prints, per file, the functions whose statements ran.
//
// It starts a redis-server, and a second process of itself that holds the
// key. Its own registry warms up (a first cycle subscribes, publishes the
// owner's name and looks at the server's eviction policy), clears the
// coverage counters, waits for the key until the holder's release grants
// it, and writes the counters and the meta-data to the directory named
// by its argument. Goroutines that run meanwhile are counted too: the
// subscription's reader delivers the grant, and the tracker arms the
// new hold.
package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime/coverage"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// holderArg makes the process the holder, on the server at the next
// argument.
const holderArg = "-hold"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "acquisitionpath:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) == 3 && os.Args[1] == holderArg {
		return hold(os.Args[2])
	}
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: acquisitionpath <dir for the coverage data>")
	}
	dir := os.Args[1]
	srv, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	r, closeRegistry, err := registry(srv.Addr())
	if err != nil {
		return err
	}
	defer closeRegistry()
	ctx := context.Background()
	lock := r.Obtain("key")
	if err := cycle(ctx, lock); err != nil {
		return err
	}
	holder := exec.Command(os.Args[0], holderArg, srv.Addr())
	holder.Env = append(os.Environ(), "GOCOVERDIR="+os.TempDir()) // its own counters are not wanted
	holder.Stderr = os.Stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		return err
	}
	if err := holder.Start(); err != nil {
		return err
	}
	defer func() { _ = holder.Wait() }() // its failure shows as no grant
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		return fmt.Errorf("the holder did not take the key")
	}
	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("%w (build it with -cover -covermode=atomic: make trace-acquisition)", err)
	}
	if err := lock.LockContext(ctx); err != nil {
		return err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return err
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return err
	}
	if grants := r.Stats().Grants; grants != 1 {
		return fmt.Errorf("the acquisition took the key by %d grants, not 1", grants)
	}
	if err := lock.UnlockContext(ctx); err != nil {
		return err
	}
	return list(dir)
}

// list prints, per file, the functions of lockreg's packages whose
// statements ran, from go tool covdata's per-function figures.
func list(dir string) error {
	out, err := exec.Command("go", "tool", "covdata", "func", "-i", dir).Output()
	if err != nil {
		return fmt.Errorf("go tool covdata: %w", err)
	}
	byFile := make(map[string][]string)
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		// github.com/lockreg/lockreg/acquire.go:36:  *Lock.acquireHold  34.8%
		if len(fields) != 3 || fields[2] == "0.0%" || !strings.HasPrefix(fields[0], module) {
			continue
		}
		file, _, _ := strings.Cut(strings.TrimPrefix(fields[0], module), ":")
		if strings.HasPrefix(file, "internal/acquisitionpath/") {
			continue
		}
		byFile[file] = append(byFile[file], fields[1])
	}
	files := slices.Sorted(maps.Keys(byFile))
	root := 0
	for _, file := range files {
		if !strings.Contains(file, "/") {
			root++
		}
	}
	fmt.Printf("One acquisition ending in a grant ran code in %d files: %d of the root package, %d in internal packages.\n", len(files), root, len(files)-root)
	for _, file := range files {
		fmt.Printf("%-32s %s\n", file, strings.Join(byFile[file], " "))
	}
	return nil
}

// module prefixes the files covdata names.
const module = "github.com/lockreg/lockreg/"

// registry makes the registry both processes share the key in, on the
// server at addr, and the function that closes it and its client.
func registry(addr string) (*lockreg.Registry, func(), error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	r, err := lockreg.New(client, "acquisitionpath")
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return r, func() {
		_ = r.Close()
		_ = client.Close()
	}, nil
}

// cycle takes the key and releases it.
func cycle(ctx context.Context, lock *lockreg.Lock) error {
	if err := lock.LockContext(ctx); err != nil {
		return err
	}
	return lock.UnlockContext(ctx)
}

// hold takes the key, says so, and releases it once the other process
// waits for it.
func hold(addr string) error {
	r, closeRegistry, err := registry(addr)
	if err != nil {
		return err
	}
	defer closeRegistry()
	ctx := context.Background()
	lock := r.Obtain("key")
	if err := lock.LockContext(ctx); err != nil {
		return err
	}
	fmt.Println("held")
	time.Sleep(time.Second) // the other's first attempt fails, and it marks and waits
	return lock.UnlockContext(ctx)
}
