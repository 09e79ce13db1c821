package protocol

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ReadSetIfFree reads SetIfFree's reply: whether the registry took the
// key. A key another owner holds is no error.
func ReadSetIfFree(cmd *redis.Cmd) (held bool, err error) {
	switch err := cmd.Err(); {
	case err == nil:
		return true, nil
	case errors.Is(err, redis.Nil):
		return false, nil
	default:
		return false, err
	}
}

// ObtainReply is what an attempt found: obtain.lua's reply, or the plain
// SET's.
type ObtainReply struct {
	Held bool // the registry holds the key now
	// LastToken is the key's last token when the attempt failed and
	// marked the registry as waiting, else 0: a grant that answers the
	// mark carries a larger one.
	LastToken int64
}

// ReadObtain reads obtain.lua's reply.
func ReadObtain(cmd *redis.Cmd) (ObtainReply, error) {
	n, err := cmd.Int64()
	if err != nil {
		return ObtainReply{}, err
	}
	switch {
	case n == 1:
		return ObtainReply{Held: true}, nil
	case n > 1 || n == math.MinInt64:
		// No reply of obtain.lua: read as a failed attempt, it would carry
		// a token below zero.
		return ObtainReply{}, fmt.Errorf("obtain.lua answered %d", n)
	}
	return ObtainReply{LastToken: -n}, nil
}

// ReleaseOutcome is what release.lua did.
type ReleaseOutcome uint8

const (
	NotOurs        ReleaseOutcome = iota // the key had expired or has another owner, who keeps it
	Deleted                              // deleted; no other registry waits
	DeletedWaited                        // deleted, and waiting registries woken
	Granted                              // granted to the registry that has waited longest
	NeedsArguments                       // nothing done: a registry waits, and only the client id was sent
)

var releaseOutcomes = [...]string{"not ours", "deleted", "deleted while waited for", "granted", "needs all arguments"}

func (o ReleaseOutcome) String() string { return name(releaseOutcomes[:], int(o), "release outcome") }

// name is names[i], or a description of i if it names none: String methods
// must not panic on a value another version sent, or a bug made.
func name(names []string, i int, what string) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return what + " " + strconv.Itoa(i)
}

// ReleaseReply is release.lua's reply.
type ReleaseReply struct {
	Outcome ReleaseOutcome
	// MarkToken, when the release granted the key and marked this
	// registry as waiting (Release.MarkNext), is the grant's token: the
	// mark's last token, as a failed attempt's would be.
	MarkToken int64
	// NoteRefused is Redis's refusal of the note to the waiters (PUBLISH,
	// forbidden by an ACL), which came once the key was deleted or
	// granted: the release is done, but the waiters were not told.
	NoteRefused string
}

// ReadRelease reads release.lua's reply.
func ReadRelease(cmd *redis.Cmd) (ReleaseReply, error) {
	if both, ok := cmd.Val().([]any); ok && cmd.Err() == nil {
		// {reply, the PUBLISH's refusal}
		if len(both) != 2 {
			return ReleaseReply{}, fmt.Errorf("release.lua answered %v", both)
		}
		refusal, isText := both[1].(string)
		if !isText {
			return ReleaseReply{}, fmt.Errorf("release.lua answered %v", both)
		}
		found, err := ReadRelease(redis.NewCmdResult(both[0], nil))
		found.NoteRefused = refusal
		return found, err
	}
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return ReleaseReply{}, err
	case n == math.MinInt64:
		// No token's opposite (a token of 2^63): -n would stay negative, a
		// mark token every grant's would exceed. As ReadObtain refuses it.
	case n < 0:
		return ReleaseReply{Outcome: Granted, MarkToken: -n}, nil
	case n <= int64(NeedsArguments):
		return ReleaseReply{Outcome: ReleaseOutcome(n)}, nil
	}
	return ReleaseReply{}, fmt.Errorf("release.lua answered %d", n)
}

// ReadRenew reads renew.lua's reply: per key, Ours if it renewed the key,
// Gone or Other if it found the key gone or holding another value. A reply
// renew.lua never gives is an error.
func ReadRenew(cmd *redis.Cmd) ([]OwnerState, error) {
	replies, err := cmd.Int64Slice()
	if err != nil {
		return nil, err
	}
	found := make([]OwnerState, len(replies))
	for i, n := range replies {
		switch n {
		case 1:
			found[i] = Ours
		case 0:
			found[i] = Gone
		case 2:
			found[i] = Other
		default:
			return nil, fmt.Errorf("renew.lua answered %d", n)
		}
	}
	return found, nil
}

// ReadRenewOne reads RenewOne's reply: whether the key was renewed.
func ReadRenewOne(cmd *redis.Cmd) (bool, error) {
	return ReadSetIfFree(cmd) // OK, or nil when the key is not the registry's
}

// NativeRenewalRefused reports whether a server refused RenewOne's SET for
// its syntax: it has no IFEQ (a failover to an older server, say).
func NativeRenewalRefused(err error) bool { return replyStarts(err, "ERR syntax error") }

// ReadToken reads token.lua's reply: the token, or 0 if the key was not
// this registry's; ErrFenceMoving if the key's slot is migrating (-1).
// Another negative number is no reply of token.lua's, and text is one only
// as drawtoken.lua writes a token (digits without a sign or a leading
// zero, beyond 2^53): Int64 would read "+42" or "042" as a token, and
// "-5" would have the caller draw again for a slot that does not move.
func ReadToken(cmd *redis.Cmd) (int64, error) {
	n, err := cmd.Int64()
	text, isText := cmd.Val().(string)
	switch {
	case err != nil:
		return 0, err
	case isText && (text[0] < '1' || text[0] > '9'):
		return 0, fmt.Errorf("token.lua answered %q", text)
	case n == -1:
		return 0, ErrFenceMoving
	case n < 0:
		return 0, fmt.Errorf("token.lua answered %d", n)
	}
	return n, nil
}

// ErrFenceMoving: token.lua ran on the lock's key alone, as while its slot
// migrates between Cluster nodes, and drew no token.
var ErrFenceMoving = errors.New("the key's slot is moving between Cluster nodes; draw the token again")

// OwnerState is who holds a lock key, as this registry sees it.
type OwnerState uint8

const (
	Ours  OwnerState = iota // this registry's client id
	Gone                    // no value: deleted, expired, evicted or flushed
	Other                   // another value (of any type): another registry's, or anyone's
)

// ReadOwner reads CheckOwner's (or Arm's) reply.
func (p *Peer) ReadOwner(c *Call) (OwnerState, error) {
	owner, err := c.Cmd.Text()
	switch {
	case err == nil && owner == p.clientID:
		return Ours, nil
	case err == nil:
		return Other, nil
	case errors.Is(err, redis.Nil):
		return Gone, nil
	case WrongType(err):
		return Other, nil // a hash, a list: overwritten
	}
	return Gone, err
}

// ReadForceUnlock reads forceunlock.lua's reply: the client id of the
// registry that held the key, if any did.
func ReadForceUnlock(cmd *redis.Cmd) (holder string, held bool, err error) {
	holder, err = cmd.Text()
	switch {
	case err == nil:
		return holder, true, nil
	case errors.Is(err, redis.Nil):
		return "", false, nil
	}
	return "", false, err
}
