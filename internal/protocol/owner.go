package protocol

import (
	"context"
	"slices"

	"github.com/redis/go-redis/v9"
)

// A registry's owner hash, <namespace>:owner:<client id> (OwnerKey), tells
// operators who holds a lock: lock keys hold the registry's client id, and
// the hash its name and since when it lives, with a time to live of two
// leases, so that a dead registry's name vanishes soon after its locks.

// Owner is what a registry's owner hash says of it: its name. (Reading
// the name alone keeps the inspectors' ACL to HGET.)
type Owner struct {
	Name string
}

// ReadOwners reads the owner hashes of the namespace's registries of
// client ids, in one pipeline. A registry that published none, or died
// more than its owner hash's time to live ago, is not in the map.
func ReadOwners(ctx context.Context, client redis.UniversalClient, namespace string, ids []string) (map[string]Owner, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	owners := make(map[string]Owner, len(ids))
	if len(ids) == 0 {
		return owners, nil
	}
	reads := make([]*redis.StringCmd, len(ids))
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			reads[i] = p.HGet(ctx, OwnerKey(namespace, id), ownerNameField)
		}
		return nil
	})
	if err := failed(cmds, err); err != nil {
		return nil, err
	}
	for i, id := range ids {
		if name, err := reads[i].Result(); err == nil {
			owners[id] = Owner{Name: name}
		}
	}
	return owners, nil
}

// The owner hash's fields: the registry's name, and since when it lives
// (unix ms).
const (
	ownerNameField  = "name"
	ownerSinceField = "since"
)
