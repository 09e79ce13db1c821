package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redact"
)

// connect makes the client o names.
func connect(o options) (redis.UniversalClient, error) {
	parts := strings.Split(o.redisURL, ",")
	var urls []*redis.Options
	for i, part := range parts {
		opt, err := redisAddress(strings.TrimSpace(part))
		if err == nil && i > 0 {
			err = unlikeFirst(opt, urls[0], strings.Contains(part, "://"), o.sentinel != "")
		}
		if err != nil {
			where := ""
			if len(parts) > 1 {
				where = fmt.Sprintf("address %d, %q: ", i+1, hidePasswords(part))
			}
			return nil, usageError("%s %q: %s%w", o.redisFrom, hidePasswords(o.redisURL), where, err)
		}
		urls = append(urls, opt)
	}
	first := urls[0]
	var addrs []string
	for _, u := range urls {
		addrs = append(addrs, u.Addr)
	}
	// go-redis bounds a read by its own 3s, not by the context, unless
	// told to; a dial and its greeting, by 5s: -timeout bounds them all.
	t := o.timeout
	switch {
	case o.sentinel != "":
		opt := &redis.FailoverOptions{
			MasterName: o.sentinel, SentinelAddrs: addrs,
			Username: first.Username, Password: first.Password, DB: first.DB, TLSConfig: first.TLSConfig,
			ContextTimeoutEnabled: true, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
		}
		if first.Password != "" && sentinelsAskForAPassword(addrs, first, t) {
			opt.SentinelUsername, opt.SentinelPassword = first.Username, first.Password
		}
		return redis.NewFailoverClient(opt), nil
	case o.cluster || len(addrs) > 1:
		for _, u := range urls {
			if u.DB != 0 {
				return nil, usageError("%s %q: database %d on a Cluster, which has database 0 alone", o.redisFrom, hidePasswords(o.redisURL), u.DB)
			}
		}
		return clusterClient(addrs, first, t), nil
	}
	first.ContextTimeoutEnabled, first.DialTimeout, first.ReadTimeout, first.WriteTimeout = true, t, t, t
	return redis.NewClient(first), nil
}

// unlikeFirst says how a later address of -redis asks for what the first's
// client cannot give it: a Cluster or Sentinel client has one user and
// password, one TLS setting and, behind Sentinels, one database, the
// first address's. A later address that names none of them takes the
// first's; HOST:PORT (no scheme) takes its TLS setting too.
func unlikeFirst(later, first *redis.Options, hasScheme, sentinels bool) error {
	switch {
	case (later.Username != "" || later.Password != "") && (later.Username != first.Username || later.Password != first.Password):
		return errors.New("another user or password than the first address's; one client takes one")
	case hasScheme && (later.TLSConfig != nil) != (first.TLSConfig != nil):
		return errors.New("rediss:// where the first address has redis://, or the other way round; one client takes one")
	case sentinels && later.DB != 0 && later.DB != first.DB:
		return fmt.Errorf("database %d where the first address has %d; one client takes one", later.DB, first.DB)
	}
	return nil
}

// sentinelsAskForAPassword reports whether the first of the Sentinels at
// addrs that answers refuses a PING without a password (NOAUTH). Sentinels
// and their servers often share one, which -redis then gives both; but
// Sentinels that ask for none refuse a password (AUTH without one set),
// so it goes to them only if they ask.
func sentinelsAskForAPassword(addrs []string, first *redis.Options, t time.Duration) bool {
	for _, addr := range addrs {
		sentinel := redis.NewSentinelClient(&redis.Options{
			Addr: addr, TLSConfig: first.TLSConfig, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
		})
		ctx, cancel := context.WithTimeout(context.Background(), t)
		err := sentinel.Ping(ctx).Err()
		cancel()
		_ = sentinel.Close()
		if err == nil || redis.HasErrorPrefix(err, "NOAUTH") {
			return err != nil
		}
	}
	return false
}

// clusterClient is a Cluster client seeded with addrs, with the options
// of first, read from -redis, and the timeouts t (see connect).
func clusterClient(addrs []string, first *redis.Options, t time.Duration) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: addrs, Username: first.Username, Password: first.Password, TLSConfig: first.TLSConfig,
		ContextTimeoutEnabled: true, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
	})
}

// clusterIfNode is client, or, if it is a plain client of a Redis Cluster
// node (one address given, without -cluster), a Cluster client seeded with
// that node: a plain one scans that node alone, so that list would miss
// the other nodes' locks, and say that none is held if that node has
// none. A server that refuses CLUSTER SLOTS is taken for a single one: its
// cluster support is disabled, or its ACL, lacking +cluster|slots, is not
// a Cluster inspector's (see the README).
func clusterIfNode(ctx context.Context, client redis.UniversalClient, o options) (redis.UniversalClient, error) {
	plain, ok := client.(*redis.Client)
	if !ok || o.sentinel != "" || plain.Options().Network == "unix" {
		return client, nil
	}
	err := plain.ClusterSlots(ctx).Err()
	var refused redis.Error
	switch {
	case errors.As(err, &refused):
		return client, nil
	case err != nil:
		return client, err
	}
	opt := plain.Options()
	_ = plain.Close()
	return clusterClient([]string{opt.Addr}, opt, o.timeout), nil
}

// schemeLike is the start of a URL whose "//" is missing or mistyped.
var schemeLike = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):/`)

// redisAddress reads one address of -redis: a redis://, rediss:// or
// unix:// URL, or HOST:PORT, and says what is wrong with it if it cannot.
func redisAddress(address string) (*redis.Options, error) {
	if address == "" {
		return nil, errors.New("an empty address (a stray comma?)")
	}
	if scheme, _, ok := strings.Cut(address, "://"); ok && !knownScheme(scheme) {
		return nil, fmt.Errorf("the scheme is %q; lockctl takes redis://, rediss:// or unix://", scheme)
	}
	if !strings.Contains(address, "://") {
		if m := schemeLike.FindStringSubmatch(address); m != nil {
			if knownScheme(m[1]) {
				return nil, fmt.Errorf(`"//" must follow %q, as in %s://HOST:PORT`, m[1]+":", m[1])
			}
			return nil, fmt.Errorf("%q is not a scheme lockctl takes (redis://, rediss:// or unix://), and the rest is not HOST:PORT", m[1]+":")
		}
		address = "redis://" + address // HOST:PORT
	}
	opt, err := parseURL(address)
	if start, at := redact.UserInfo(address); err != nil && at >= 0 && strings.ContainsAny(address[start:at], "/?#") {
		// The URL's host or path took in part of the password, which err
		// would quote.
		err = errors.New(`the user or password holds '/', '?' or '#': percent-encode it (%2F, %3F, %23)`)
	}
	return opt, err
}

// parseURL is redis.ParseURL, whose errors do not repeat the URL.
func parseURL(address string) (*redis.Options, error) {
	if _, err := url.Parse(address); err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // its message repeats the URL, password and all
		}
		return nil, err
	}
	opt, err := redis.ParseURL(address)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "redis: "))
	}
	return opt, nil
}

func knownScheme(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		return true
	}
	return false
}

// hidePasswords hides the passwords of a -redis value, one address or
// several.
func hidePasswords(value string) string {
	parts := strings.Split(value, ",")
	for i, part := range parts {
		parts[i] = redact.URL(part)
	}
	return strings.Join(parts, ",")
}

// explainRedisError says, of an error that Redis could not be reached or
// did not answer in time, which Redis, and for how long.
func explainRedisError(err error, o options) error {
	if err == nil || errors.Is(err, errUsage) || errors.Is(err, errNotFound) {
		return err
	}
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("cannot reach Redis (%s %q): %w", o.redisFrom, hidePasswords(o.redisURL), opErr)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer from Redis (%s %q) within -timeout %v: %w", o.redisFrom, hidePasswords(o.redisURL), o.timeout, err)
	}
	return err
}
