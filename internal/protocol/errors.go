package protocol

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Permanent reports whether a call's error would come again however often
// the call were retried, so that an acquisition should end at once rather
// than retry until its context ends: the server refused the call itself
// (WRONGTYPE: the lock key holds a hash or a list; NOPERM: an ACL forbids
// a command; an unknown command, as behind a proxy; a script error;
// authentication), or the client was closed. What passes is transient:
// no connection or a broken one, a timeout, a server that is loading,
// failing over, migrating a slot or busy (see transientReplies).
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, redis.ErrClosed) {
		return true
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false // not the server's answer: the network, a timeout, a context
	}
	msg := reply.Error()
	for _, prefix := range transientReplies {
		if strings.HasPrefix(msg, prefix) {
			return false
		}
	}
	return true
}

// transientReplies are the server's error replies that a retry may
// outlast: a server loading its data, a replica without its primary, a
// slot moving or the cluster reconfiguring, a primary turned replica in a
// failover, a long script, too few replicas for a write, memory or disk
// full for now, a connection limit.
var transientReplies = []string{
	"LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "READONLY",
	"BUSY ", "NOREPLICAS", "OOM", "MISCONF", "NOSCRIPT",
	"ERR max number of clients reached",
}

// WrongType reports whether err is the server's refusal of a command on
// a key of another type: a lock key that someone made a hash or a list,
// which is no registry's.
func WrongType(err error) bool { return replyStarts(err, "WRONGTYPE") }

// OutOfMemory reports whether err is a full server's refusal of a command
// that may grow its data (maxmemory reached, maxmemory-policy
// noeviction): SET, ZADD, HSET. PEXPIRE and DEL pass, and so does every
// write of a script after its first.
func OutOfMemory(err error) bool { return replyStarts(err, "OOM") }

// IsReply reports whether err is the server's own error reply, rather than
// a failure to reach it or to read its answer.
func IsReply(err error) bool {
	if err == nil {
		return false
	}
	var reply redis.Error
	return errors.As(err, &reply)
}

// replyStarts reports whether err is an error reply of the server that
// starts with prefix, "ERR " included: redis.HasErrorPrefix drops a
// leading "ERR " before it compares, so a prefix that names it never
// matches there.
func replyStarts(err error, prefix string) bool {
	if err == nil {
		return false // before errors.As, whose target escapes: a release's nil error cost an allocation
	}
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), prefix)
}
