package lockregtest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregtest"
)

// pack is the code under test: it packs an order's parcels, as they
// come, under the order's lock, and must stop once the lock is lost:
// another process may be packing the order by then.
func pack(ctx context.Context, r *lockreg.Registry, order string, parcels <-chan string) error {
	return r.Do(ctx, order, func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return fmt.Errorf("pack %s: %w", order, context.Cause(ctx))
			case parcel, ok := <-parcels:
				if !ok {
					return nil
				}
				fmt.Println("packed", parcel)
			}
		}
	})
}

// A test of pack's loss path: the lock is lost after the first parcel,
// and pack returns an error that says so.
func ExampleLose() {
	t := &exampleT{} // in a test, its *testing.T
	defer t.cleanup()

	r := lockregtest.New(t)
	parcels := make(chan string)
	done := make(chan error)
	go func() { done <- pack(context.Background(), r, "order-42", parcels) }()
	parcels <- "parcel-1" // pack holds the lock once it takes a parcel
	lockregtest.Lose(t, r, "order-42")
	err := <-done
	fmt.Println(errors.Is(err, lockreg.ErrLockLost))
	fmt.Println(err)
	// Output:
	// packed parcel-1
	// true
	// pack order-42: lockreg: lock lost: key "order-42": an operator forced its key open (ForceUnlock)
}

// exampleT stands in for the *testing.T that an Example lacks: it runs
// the cleanups, and panics where a test would fail.
type exampleT struct {
	testing.TB // nil: lockregtest calls only the methods below
	cleanups   []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Name() string                      { return "Example" }
func (t *exampleT) Output() io.Writer                 { return io.Discard }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
