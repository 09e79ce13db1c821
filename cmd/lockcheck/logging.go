//go:build linux

package main

import (
	"context"
	"io"
	"sync"
)

// lockedWriter serializes writes to w: the checker's log lines and its
// workers' stderr, which os/exec copies in goroutines of its own unless w
// is a file, share one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// quietRedis drops go-redis's own log lines (redis.SetLogger). Faults make
// it log every failed dial, dropped connection and Sentinel switch, by the
// thousand in a long run; the history records what happened.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
