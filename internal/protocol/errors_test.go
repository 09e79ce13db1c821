package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// serverReply is a server's error reply, as go-redis's redis.Error.
type serverReply string

func (r serverReply) Error() string { return string(r) }
func (serverReply) RedisError()     {}

func TestPermanentTellsErrorsThatRetryingWouldNotMend(t *testing.T) {
	for reply, permanent := range map[string]bool{
		"WRONGTYPE Operation against a key holding the wrong kind of value":                       true,
		"NOPERM User locker has no permissions to run the 'set' command":                          true,
		"ERR unknown command 'evalsha', with args beginning with: ":                               true,
		"ERR Error running script (call to f_0123): @user_script:1: oops":                         true,
		"NOAUTH Authentication required.":                                                         true,
		"WRONGPASS invalid username-password pair or user is disabled.":                           true,
		"CROSSSLOT Keys in request don't hash to the same slot":                                   true,
		"LOADING Redis is loading the dataset in memory":                                          false,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.":        false,
		"TRYAGAIN Multiple keys request during rehashing of slot":                                 false,
		"CLUSTERDOWN The cluster is down":                                                         false,
		"MOVED 3999 127.0.0.1:6381":                                                               false,
		"ASK 3999 127.0.0.1:6381":                                                                 false,
		"READONLY You can't write against a read only replica.":                                   false,
		"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.":  false,
		"NOREPLICAS Not enough good replicas to write.":                                           false,
		"OOM command not allowed when used memory > 'maxmemory'.":                                 false,
		"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist": false,
		"NOSCRIPT No matching script. Please use EVAL.":                                           false,
		"ERR max number of clients reached":                                                       false,
	} {
		require.Equal(t, permanent, Permanent(serverReply(reply)), reply)
		require.Equal(t, permanent, Permanent(fmt.Errorf("wrapped: %w", serverReply(reply))), "wrapped: "+reply)
	}
	for name, err := range map[string]error{
		"a closed client": redis.ErrClosed,
		"wrapped":         fmt.Errorf("lockreg: %w", redis.ErrClosed),
	} {
		require.True(t, Permanent(err), name)
	}
	for name, err := range map[string]error{
		"none":               nil,
		"connection refused": &net.OpError{Op: "dial", Err: errors.New("connection refused")},
		"a broken pipe":      &net.OpError{Op: "write", Err: errors.New("broken pipe")},
		"EOF":                io.EOF,
		"a read timeout":     os.ErrDeadlineExceeded,
		"a pool timeout":     redis.ErrPoolTimeout,
		"ctx's end":          context.DeadlineExceeded,
		"a cancelled ctx":    context.Canceled,
	} {
		require.False(t, Permanent(err), name)
	}
}

func TestRenewsNativelyOnValkey81AndRedis84(t *testing.T) {
	for info, native := range map[string]bool{
		"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n": true,
		"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.3\r\n": false,
		"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.0.0\r\n": true,
		"# Server\r\nredis_version:8.0.2\r\n":                                               false,
		"# Server\r\nredis_version:8.4.0\r\n":                                               true,
		"# Server\r\nredis_version:7.0.15\r\n":                                              false,
		"# Server\r\nredis_version:10.0.0\r\n":                                              true,
		"":                                                                                  false,
	} {
		require.Equal(t, native, RenewsNatively(info), info)
	}
}

// TestRefusalsAreToldByTheirWholeReply: the refusals that name "ERR" are
// told by their whole reply, which redis.HasErrorPrefix cannot do (it
// drops a leading "ERR "), as the server sends them: a SET with an option
// it does not know (IFEQ before Valkey 8.1 and Redis 8.4), and tracking
// redirected to a connection that is gone.
func TestRefusalsAreToldByTheirWholeReply(t *testing.T) {
	e := newEnv(t)
	_, err := e.client.Do(e.ctx, "set", "refusal", "v", "nosuchoption").Result()
	require.True(t, NativeRenewalRefused(err), "%v", err)
	require.False(t, NativeRenewalRefused(serverReply("syntax error")))
	require.False(t, NativeRenewalRefused(serverReply("WRONGTYPE Operation against a key holding the wrong kind of value")))

	conn := e.client.Conn()
	defer conn.Close()
	err = conn.Do(e.ctx, TrackingArgs(1<<40)...).Err()
	require.True(t, TargetGone(err), "%v", err)
	require.False(t, TargetGone(serverReply("NOPERM User locker has no permissions to run the 'client|tracking' command")))
}
