package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/keytext"
)

// printer prints locks as tables or JSON.
type printer struct {
	out  io.Writer
	json bool
}

// lockJSON is a lock as -json prints it: its key whole, its TTL -1 for a
// key without expiry (as PTTL says). A JSON string is UTF-8, so a key that
// is not (arbitrary bytes) comes out with U+FFFD for its invalid bytes;
// KeyBase64 then has its bytes, from which a script gets the key back.
type lockJSON struct {
	Key       string       `json:"key"`
	KeyBase64 string       `json:"key_base64,omitempty"`
	Held      bool         `json:"held"`
	Owner     string       `json:"owner"`
	OwnerID   string       `json:"owner_id"`
	OwnerLive bool         `json:"owner_live"`
	TTLms     int64        `json:"ttl_ms"`
	Token     int64        `json:"token"`
	Waiting   []waiterJSON `json:"waiting"`
}

type waiterJSON struct {
	Owner   string `json:"owner"`
	OwnerID string `json:"owner_id"`
}

func toJSON(info lockreg.LockInfo) lockJSON {
	j := lockJSON{Key: info.Key, Held: info.Held, Owner: info.Owner, OwnerID: info.OwnerID, OwnerLive: live(info),
		TTLms: info.TTL.Milliseconds(), Token: info.Token, Waiting: []waiterJSON{}}
	if !utf8.ValidString(info.Key) {
		j.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(info.Key))
	}
	if info.TTL == lockreg.NoExpiry {
		j.TTLms = -1 // NoExpiry is -1ns, 0 in milliseconds
	}
	for _, w := range info.Waiting {
		j.Waiting = append(j.Waiting, waiterJSON{Owner: w.Owner, OwnerID: w.OwnerID})
	}
	return j
}

func (p printer) table(infos []lockreg.LockInfo) error {
	if p.json {
		all := make([]lockJSON, 0, len(infos))
		for _, info := range infos {
			all = append(all, toJSON(info))
		}
		return json.NewEncoder(p.out).Encode(all)
	}
	if len(infos) == 0 {
		return nil
	}
	// The key comes last: it may be 200 bytes and more, which would push
	// every row's other columns out of sight.
	rows := [][]string{{"TTL", "TOKEN", "WAITING", "STATE", "OWNER", "KEY"}}
	for _, info := range infos {
		rows = append(rows, []string{formatTTL(info.TTL), formatToken(info.Token), strconv.Itoa(len(info.Waiting)),
			ownerState(info), ownerOf(info.Owner, info.OwnerID), quoteKey(info.Key)})
	}
	_, err := io.WriteString(p.out, columns(rows, []bool{true, true, true, false, false, false}))
	return err
}

// columns lays rows out in columns two spaces apart, right-aligned where
// right says so, as wide as their widest cell in characters.
func columns(rows [][]string, right []bool) string {
	widths := make([]int, len(right))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if right[i] {
				line.WriteString(pad + cell)
			} else {
				line.WriteString(cell + pad)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return b.String()
}

func (p printer) detail(info lockreg.LockInfo) error {
	if p.json {
		return json.NewEncoder(p.out).Encode(toJSON(info))
	}
	w := tabwriter.NewWriter(p.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "key\t%s\n", quoteKey(info.Key))
	fmt.Fprintf(w, "owner\t%s\n", ownerOf(info.Owner, info.OwnerID))
	if live(info) {
		fmt.Fprintf(w, "state\tlive: its registry was seen within the last two leases\n")
	} else {
		fmt.Fprintf(w, "state\tgone: no sign of its registry for two leases (it died, or could not write its owner hash)\n")
	}
	fmt.Fprintf(w, "owner id\t%s\n", shown(info.OwnerID))
	fmt.Fprintf(w, "ttl\t%s\n", formatTTL(info.TTL))
	fmt.Fprintf(w, "token\t%s\n", formatToken(info.Token))
	for i, waiter := range info.Waiting {
		fmt.Fprintf(w, "waiting %d\t%s\n", i+1, ownerOf(waiter.Owner, waiter.OwnerID))
	}
	return w.Flush()
}

func (p printer) unlocked(info lockreg.LockInfo) error {
	if p.json {
		return json.NewEncoder(p.out).Encode(map[string]any{"unlocked": toJSON(info)})
	}
	state := "gone"
	if live(info) {
		state = "live: it may still be working, and learns that it lost the lock"
	}
	_, err := fmt.Fprintf(p.out, "unlocked %s, held by %s (%s)\n", quoteKey(info.Key), ownerOf(info.Owner, info.OwnerID), state)
	return err
}

// live says whether the lock's owner is live: its owner hash, which
// lives two leases past the registry's last refresh, is there.
func live(info lockreg.LockInfo) bool { return info.Owner != "" }

func ownerState(info lockreg.LockInfo) string {
	if live(info) {
		return "live"
	}
	return "gone"
}

// ownerOf names an owner: by name, or by client id if it has none.
func ownerOf(name, id string) string {
	if name == "" {
		return "client " + shown(id)
	}
	return shown(name)
}

// shown is a value read from Redis as lockctl prints it. Owner names and
// lock keys' values are whatever a service or anyone who can write the key
// set: one with control characters, which would break the table into
// false rows or drive the operator's terminal, or not UTF-8, is quoted;
// so is an empty one (a lock key's of another type too), which would
// print as nothing.
func shown(value string) string {
	if value != "" && utf8.ValidString(value) && !strings.ContainsFunc(value, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return value
	}
	return strconv.Quote(value)
}

// formatTTL prints a lease's rest: tenths of seconds under a minute,
// seconds above.
func formatTTL(ttl time.Duration) string {
	switch {
	case ttl == lockreg.NoExpiry:
		return "no expiry"
	case ttl < time.Minute:
		return fmt.Sprintf("%.1fs", ttl.Seconds())
	}
	return ttl.Round(time.Second).String()
}

// formatToken prints a fencing token, "-" if none is stored.
func formatToken(token int64) string {
	if token == 0 {
		return "-"
	}
	return strconv.FormatInt(token, 10)
}

// ttlPhrase says how long the owner holds the key still.
func ttlPhrase(ttl time.Duration) string {
	if ttl == lockreg.NoExpiry {
		return "with no expiry"
	}
	return "for another " + formatTTL(ttl)
}

// expiryPhrase says when the key frees itself.
func expiryPhrase(ttl time.Duration) string {
	if ttl == lockreg.NoExpiry {
		return "the key has no expiry: nothing else frees it"
	}
	return "the key expires by itself in " + formatTTL(ttl)
}

// quoteKey quotes key for a person to read, cut as lockreg's errors and
// logs cut it.
func quoteKey(key string) string { return strconv.Quote(keytext.Short(key)) }

// quoteAll quotes each of args.
func quoteAll(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = quoteKey(a)
	}
	return strings.Join(quoted, " ")
}
