package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestURLHidesThePasswordAlone(t *testing.T) {
	for address, want := range map[string]string{
		"redis://u:pw@h:1/0":             "redis://u:xxxxx@h:1/0",
		"redis://:pw@h":                  "redis://:xxxxx@h",
		"redis://u@h":                    "redis://u@h",
		"u:pw@h:1":                       "u:xxxxx@h:1",
		"redis://h/0?password=x":         "redis://h/0?password=x", // go-redis reads no password from the query
		"rediss://u:p@ss@h:1":            "rediss://u:xxxxx@h:1",
		"127.0.0.1:6379":                 "127.0.0.1:6379",
		"unix://u:pw@/run/redis.sock":    "unix://u:xxxxx@/run/redis.sock",
		"htp:/foo":                       "htp:/foo",
		"redis://h:1/0?dial_timeout=1s@": "redis://h:1/0?dial_timeout=1s@",
		"redis://u:p/w?x#y@h:1/0":        "redis://u:xxxxx@h:1/0", // unescaped, yet hidden
		"redis://u:p%2Fw@h:1":            "redis://u:xxxxx@h:1",
	} {
		require.Equal(t, want, URL(address), address)
		require.Equal(t, want != address, HasPassword(address), address)
	}
}
