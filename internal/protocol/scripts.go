package protocol

import "github.com/redis/go-redis/v9"

// Sources are the scripts' Lua texts, which lockreg embeds from the
// repository's root (the .lua files there) and hands to NewScripts.
type Sources struct {
	// DrawToken and MarkWaiting are libraries: functions the scripts
	// below call, put before them.
	DrawToken, MarkWaiting                     string
	Obtain, Release, Token, Renew, ForceUnlock string
	// RaiseFence runs before a release on the lock's key alone, while
	// the key's slot migrates, that must store a token handed out.
	RaiseFence string
}

// Scripts are the protocol's scripts, each with the libraries it uses.
// Run and RunPipeline send EVALSHA and fall back to EVAL on NOSCRIPT, so
// a restarted Redis costs one extra round trip, once.
type Scripts struct {
	obtain, release, token, renew, forceUnlock, raiseFence *Script
}

// NewScripts makes the scripts of src.
func NewScripts(src Sources) *Scripts {
	return &Scripts{
		obtain:      newScript(src.DrawToken + src.MarkWaiting + src.Obtain),
		release:     newScript(src.DrawToken + src.MarkWaiting + src.Release),
		token:       newScript(src.DrawToken + src.Token),
		renew:       newScript(src.Renew),
		forceUnlock: newScript(src.ForceUnlock),
		raiseFence:  newScript(src.DrawToken + src.RaiseFence),
	}
}

// Script is a script with its SHA1 boxed once, as an EVALSHA argument: a
// call on the caller's path (Run) then boxes only its keys.
type Script struct {
	*redis.Script
	hash any
}

func newScript(src string) *Script {
	s := redis.NewScript(src)
	return &Script{Script: s, hash: s.Hash()}
}

// Call is one call to Redis: a script with its keys and arguments, or,
// with no script, the plain command Args. Cmd holds its reply once it was
// made (Run, RunPipeline).
type Call struct {
	Script *Script
	Keys   []string
	Args   []any
	Cmd    *redis.Cmd
}

// OnLockKeyOnly is the call run on the lock's key alone, as the scripts
// are while the lock's slot moves between Cluster nodes: Redis refuses a
// script whose keys are split between the nodes or partly missing, which
// the fence, the marker and the queue usually are, and always serves the
// lock's key. Each script then does what it can without the others (see
// the scripts).
func (c Call) OnLockKeyOnly() Call {
	c.Keys = c.Keys[:1]
	return c
}

// firstKey is the key that places the call on a Redis Cluster node: a
// script's first key, or a plain command's first argument after its name.
// All the keys of one call share a slot.
func (c *Call) firstKey() string {
	if c.Script != nil {
		if len(c.Keys) > 0 {
			return c.Keys[0]
		}
		return ""
	}
	if len(c.Args) > 1 {
		if key, ok := c.Args[1].(string); ok {
			return key
		}
	}
	return ""
}
