package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/lockreg/lockreg"
)

// unlock forces key open, once the operator confirmed it (or passed
// -yes), and only while the registry shown to the operator holds it.
func (c commandRun) unlock(key string, yes, terminal bool, stdin io.Reader, stderr io.Writer) error {
	info, err := c.inspectHeld(key)
	if err != nil {
		return err
	}
	if !yes {
		if !terminal {
			return usageError("unlock asks for confirmation on a terminal; pass -yes to unlock without asking")
		}
		ok, err := confirmUnlessInterrupted(c.interrupt, stdin, stderr, info)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("not unlocked")
		}
	}
	ctx, cancel := c.again()
	defer cancel()
	// The key is forced open only while the registry the operator was
	// shown holds it: one that took the key since is left alone. An empty
	// value, which no registry sets, names none: it is forced whatever.
	force := func() (bool, error) { return c.registry.ForceUnlockHeldBy(ctx, key, info.OwnerID) }
	if info.OwnerID == "" {
		force = func() (bool, error) { return c.registry.ForceUnlock(ctx, key) }
	}
	found, err := force()
	if err != nil || found {
		if err == nil {
			err = c.p.unlocked(info)
		}
		return err
	}
	now, err := c.registry.Inspect(ctx, key)
	switch {
	case err != nil:
		return err
	case now.Held:
		return fmt.Errorf("%s changed hands: %s holds it now; not unlocked (run unlock again to see it)", quoteKey(key), ownerOf(now.Owner, now.OwnerID))
	}
	return notFoundError("%s was released meanwhile", quoteKey(key))
}

// confirmUnlessInterrupted is confirm, ended by ctx's end: main takes
// Ctrl-C over (to end the Redis calls), so a read of the terminal would
// otherwise outlast it, and lockctl would hang at the prompt until Enter.
func confirmUnlessInterrupted(ctx context.Context, stdin io.Reader, stderr io.Writer, info lockreg.LockInfo) (bool, error) {
	answered := make(chan bool, 1)
	go func() { answered <- confirm(stdin, stderr, info) }() // left reading stdin if interrupted: lockctl exits next
	select {
	case ok := <-answered:
		return ok, nil
	case <-ctx.Done():
		fmt.Fprintln(stderr)
		return false, fmt.Errorf("interrupted at the prompt: not unlocked: %w", context.Cause(ctx))
	}
}

// confirm asks on a terminal whether to force info's lock open: warning,
// if its owner is live, that it may still be working.
func confirm(stdin io.Reader, stderr io.Writer, info lockreg.LockInfo) bool {
	var prompt string
	if live(info) {
		prompt = fmt.Sprintf("Force %s open? %s holds it (live: seen within two leases) %s, and may still be working.",
			quoteKey(info.Key), ownerOf(info.Owner, info.OwnerID), ttlPhrase(info.TTL))
	} else {
		prompt = fmt.Sprintf("Force %s open? Its owner, %s, is gone (not seen for two leases); %s.",
			quoteKey(info.Key), ownerOf(info.Owner, info.OwnerID), expiryPhrase(info.TTL))
	}
	fmt.Fprint(stderr, prompt+" [y/N] ")
	answer, _ := bufio.NewReader(stdin).ReadString('\n')
	answer = strings.ToLower(strings.TrimSpace(answer))
	return answer == "y" || answer == "yes"
}
