package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ServerEnv names the server that the tests run on, one of Servers:
// redis-7.0 (the system's, Debian bookworm's), redis-8.0 or valkey-8.1
// (Debian trixie's), each from the bin dir that scripts/servers installs.
// Unset, the tests run redis-server (and redis-sentinel, redis-cli) from
// PATH. REDIS_SERVER and REDIS_SENTINEL override it either way.
const ServerEnv = "LOCKREG_SERVER"

// Servers are the values ServerEnv can take.
var Servers = []string{"redis-7.0", "redis-8.0", "valkey-8.1"}

// program returns the program to run for name, the Redis name of a
// program (redis-server, redis-sentinel, redis-cli): env's value if env is
// set, the program of ServerEnv's server if that is set, and name (for
// PATH) otherwise. A server of ServerEnv that is unknown or not installed
// is an error, never a fallback to PATH.
func program(env, name string) (string, error) {
	if env != "" {
		if bin := os.Getenv(env); bin != "" {
			return bin, nil
		}
	}
	server := os.Getenv(ServerEnv)
	if server == "" {
		return name, nil
	}
	dir, err := serverBinDir(server)
	if err != nil {
		return "", err
	}
	// Valkey's programs are valkey-server, valkey-sentinel, valkey-cli.
	prefix, _, _ := strings.Cut(server, "-")
	path := filepath.Join(dir, prefix+strings.TrimPrefix(name, "redis"))
	if info, err := os.Stat(path); err != nil || info.IsDir() {
		return "", fmt.Errorf("redistest: %s=%s: not installed (no %s); run scripts/servers install %s", ServerEnv, server, path, server)
	}
	return path, nil
}

// serverBinDir is where scripts/servers puts server's programs:
// $LOCKREG_SERVERS_DIR/<server>/bin, or
// ${XDG_CACHE_HOME:-$HOME/.cache}/lockreg/servers/<server>/bin.
func serverBinDir(server string) (string, error) {
	known := false
	for _, s := range Servers {
		known = known || s == server
	}
	if !known {
		return "", fmt.Errorf("redistest: %s=%s: unknown server; one of %s, or unset for redis-server from PATH", ServerEnv, server, strings.Join(Servers, ", "))
	}
	root := os.Getenv("LOCKREG_SERVERS_DIR")
	if root == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("redistest: %s=%s: %w; set LOCKREG_SERVERS_DIR to scripts/servers' cache", ServerEnv, server, err)
		}
		root = filepath.Join(cache, "lockreg", "servers")
	}
	return filepath.Join(root, server, "bin"), nil
}
