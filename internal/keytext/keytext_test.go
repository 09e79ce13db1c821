package keytext

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestShortKeepsShortKeysWhole(t *testing.T) {
	key := strings.Repeat("k", Max)
	require.Equal(t, key, Short(key))
}

func TestShortCutsALongKeyToItsHeadAndLength(t *testing.T) {
	key := strings.Repeat("k", 1<<20)
	require.Equal(t, strings.Repeat("k", Max)+"… (1048576 bytes)", Short(key))
}

// TestShortCutsBetweenCharacters: a cut inside a character would print
// invalid UTF-8 (a � in a log line, an invalid string for a JSON encoder).
func TestShortCutsBetweenCharacters(t *testing.T) {
	for pad := range 4 {
		key := strings.Repeat("k", pad) + strings.Repeat("鎖", Max) // 3 bytes each
		short := Short(key)
		require.True(t, utf8.ValidString(short), "pad %d: %q", pad, short)
		head := short[:strings.LastIndex(short, "…")]
		require.LessOrEqual(t, len(head), Max)
		require.Greater(t, len(head), Max-utf8.UTFMax, "pad %d", pad)
		require.True(t, strings.HasPrefix(key, head))
	}
}

func FuzzShort(f *testing.F) {
	f.Add(strings.Repeat("é", 150))
	f.Add(strings.Repeat("\x80", 300))
	f.Add(strings.Repeat("…", 100))
	f.Fuzz(func(t *testing.T, key string) {
		short := Short(key)
		if len(key) <= Max {
			require.Equal(t, key, short)
			return
		}
		head := short[:strings.LastIndex(short, "…")]
		require.True(t, strings.HasPrefix(key, head))
		require.Greater(t, len(head), Max-utf8.UTFMax)
		if utf8.ValidString(key) {
			require.True(t, utf8.ValidString(short))
		}
	})
}
