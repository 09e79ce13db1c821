package main

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// slowOperator reads the prompt for a while, does meanwhile what the test
// asks (if anything), then answers y.
type slowOperator struct {
	reads     time.Duration
	meanwhile func()
	answered  bool
}

func (o *slowOperator) Read(p []byte) (int, error) {
	if o.answered {
		return 0, io.EOF
	}
	time.Sleep(o.reads)
	if o.meanwhile != nil {
		o.meanwhile()
	}
	o.answered = true
	return copy(p, "y\n"), nil
}

func newNamedRegistry(t *testing.T, srv *redistest.Server, owner string) *lockreg.Registry {
	t.Helper()
	r, err := lockreg.New(srv.Client(t), "orders", lockreg.WithOwner(owner))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// The time an operator takes at the prompt is theirs: -timeout bounds the
// Redis calls before it and after it, each.
func TestUnlockGivesTheOperatorTheirTimeAtThePrompt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	h, err := newNamedRegistry(t, srv, "billing/pod-7").Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-redis", srv.Addr(), "-namespace", "orders", "-timeout", "1s", "unlock", "o-1"},
		&slowOperator{reads: 1500 * time.Millisecond}, &stdout, &stderr, true)
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost, "forced open")
}

// The holder changes while the operator reads the prompt: worker-A
// releases, worker-B takes the key. The operator agreed to force
// worker-A's lock open, so worker-B's hold is left alone, and lockctl says
// so.
func TestUnlockForcesOpenOnlyWhileTheRegistryItShowedHoldsTheKey(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	a, b := newNamedRegistry(t, srv, "worker-A"), newNamedRegistry(t, srv, "worker-B")
	ha, err := a.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	var hb *lockreg.Hold
	operator := &slowOperator{reads: 50 * time.Millisecond, meanwhile: func() {
		require.NoError(t, ha.Release(ctx))
		hb, err = b.Obtain("o-1").Acquire(ctx)
		require.NoError(t, err)
	}}
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-redis", srv.Addr(), "-namespace", "orders", "unlock", "o-1"},
		operator, &stdout, &stderr, true)
	require.Equal(t, exitError, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
	require.Regexp(t, `"o-1" changed hands: .* holds it now; not unlocked`, stderr.String())
	require.NoError(t, hb.Err(), "worker-B still holds it")
	info, err := b.Inspect(ctx, "o-1")
	require.NoError(t, err)
	require.True(t, info.Held)
	require.NoError(t, hb.Release(ctx))
}

// A lock key set by hand to an empty value blocks the key; Inspect shows
// it held by an unknown owner, and unlock forces it open (no registry
// sets such a value, so none is named).
func TestUnlockForcesOpenAnEmptyForeignValue(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	lockKey := protocol.LockKeys("orders", "o-1").Lock()
	require.NoError(t, srv.Client(t).Set(ctx, lockKey, "", 0).Err())
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-redis", srv.Addr(), "-namespace", "orders", "-yes", "unlock", "o-1"}, nil, &stdout, &stderr, false)
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
	require.Zero(t, srv.Client(t).Exists(ctx, lockKey).Val(), "forced open")
}

// An interrupt (Ctrl-C, which lockctl takes over to end its Redis calls)
// while the operator reads the prompt ends lockctl with nothing unlocked:
// it does not wait for an answer that will not come.
func TestAnInterruptAtThePromptEndsUnlock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	h, err := newNamedRegistry(t, srv, "billing/pod-7").Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	stdin, typing := io.Pipe()
	defer typing.Close()
	interrupted, interrupt := context.WithCancel(ctx)
	defer interrupt()
	var stdout bytes.Buffer
	stderr := &promptWatch{asked: make(chan struct{})}
	code := make(chan int, 1)
	go func() {
		code <- run(interrupted, []string{"-redis", srv.Addr(), "-namespace", "orders", "unlock", "o-1"}, stdin, &stdout, stderr, true)
	}()
	select {
	case <-stderr.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("no prompt")
	}
	interrupt()
	select {
	case c := <-code:
		require.Equal(t, exitError, c)
	case <-time.After(5 * time.Second):
		_ = typing.CloseWithError(io.EOF)
		<-code
		t.Fatal("lockctl waited at the prompt after the interrupt")
	}
	require.NoError(t, h.Err(), "nothing unlocked")
	require.NoError(t, h.Release(ctx))
}

// promptWatch is a stderr that tells when the prompt was written.
type promptWatch struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	asked chan struct{}
	once  sync.Once
}

func (w *promptWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Contains(p, []byte("[y/N]")) {
		w.once.Do(func() { close(w.asked) })
	}
	return w.buf.Write(p)
}

// A lock key made a hash by hand blocks the lock, and show says it is
// held with no expiry: unlock frees it, as nothing else would.
func TestUnlockFreesALockKeyOfAnotherType(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	lockKey := protocol.LockKeys("orders", "o-1").Lock()
	require.NoError(t, srv.Client(t).HSet(ctx, lockKey, "by", "hand").Err())
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-redis", srv.Addr(), "-namespace", "orders", "unlock", "-yes", "o-1"},
		nil, &stdout, &stderr, false)
	require.Equal(t, exitOK, code, "stdout: %s\nstderr: %s", &stdout, &stderr)
	require.Zero(t, srv.Client(t).Exists(ctx, lockKey).Val(), "unlocked")
}
