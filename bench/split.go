// S4's hand-off split (#34, item 1): passes of lockreg and of the
// hand-off floor, probed alike (contenders.Probe), that split each
// hand-off between processes into its parts, so that a change to the
// hand-off can be judged part by part against what the floor's one
// PUBLISH costs under the same load.

package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
)

// splitRounds is how many passes of each the split makes, lockreg's and
// the floor's taking turns (ABA...: the first of a round alternates), so
// that the machine's drift falls on both alike.
const splitRounds = 3

// HandoffSplit is S4's hand-offs between processes split into parts,
// lockreg's and the floor's, in passes of their own (each Pass ns long,
// Rounds of each) in which the worker processes are probed.
type HandoffSplit struct {
	Rounds         int
	Pass           float64
	LockReg, Floor SplitParts
	Err            string `json:",omitempty"`
}

// SplitParts is one contender's split: the hand-offs between processes
// over all its passes, those that could be split (the release call was
// timed, and the next process heard the grant between that call's
// sending and its hold), lockreg's taken by grant, the share of split
// hand-offs whose grant was heard before the releaser read its reply,
// the PING round trip's p50 during the passes (the harness's yardstick),
// and each part's quantiles, in splitPartNames' order.
type SplitParts struct {
	Handoffs, Split, Grants int
	HeardFirst              float64
	PingP50                 float64
	Parts                   []SplitPart
	// Command is the releasing command (lockreg: evalsha; the floor:
	// publish), and ServerP50, ServerP99 its own time in Redis, in ns
	// (INFO latencystats, reset before each pass; the median of the
	// passes' figures). lockreg's EVALSHAs are mostly its granting
	// releases, but its attempts and renewals count too.
	Command              string  `json:",omitempty"`
	ServerP50, ServerP99 float64 `json:",omitempty"`
}

// SplitPart is one part's p50 and p99, ns.
type SplitPart struct {
	Name     string
	P50, P99 float64
}

// The parts of one hand-off between processes, in time order; the last
// is the whole (over the split hand-offs only). "sent" is the releasing
// call (lockreg: release.lua; the floor: its PUBLISH) going to go-redis,
// "reply" its reply read, "heard" the next process reading the grant
// (the floor: the baton) off its subscription's connection, "held" that
// process's Acquire returning.
var splitPartNames = []string{
	"release begun → call sent",
	"call sent → reply (the releaser's round trip)",
	"reply → release returned",
	"call sent → grant heard by the next process",
	"grant heard → the next process's Acquire returned",
	"hand-off: release begun → next held",
}

// splitParts is what one pass measured, each part's durations.
type splitParts struct {
	handoffs, split, grants, heardFirst int
	parts                               [][]time.Duration // by splitPartNames
	pings                               []time.Duration
	// serverP50, serverP99: the releasing command's time in Redis, one
	// figure per pass.
	serverP50, serverP99 []time.Duration
}

// splitHandoffs reads the parts off one pass's holds (numbered across its
// processes).
func splitHandoffs(holds []turn) splitParts {
	slices.SortFunc(holds, func(a, b turn) int { return int(a.Seq - b.Seq) })
	p := splitParts{parts: make([][]time.Duration, len(splitPartNames))}
	for i := 1; i < len(holds); i++ {
		prev, next := holds[i-1], holds[i]
		if next.Proc == prev.Proc {
			continue
		}
		p.handoffs++
		if next.Path == "grant" {
			p.grants++
		}
		if prev.Sent == 0 || prev.Replied < prev.Sent || next.Heard < prev.Sent || next.Heard > next.Acquired {
			continue
		}
		p.split++
		if next.Heard < prev.Replied {
			p.heardFirst++
		}
		for k, d := range []int64{
			prev.Sent - prev.Released,
			prev.Replied - prev.Sent,
			prev.Returned - prev.Replied,
			next.Heard - prev.Sent,
			next.Acquired - next.Heard,
			next.Acquired - prev.Released,
		} {
			p.parts[k] = append(p.parts[k], time.Duration(d))
		}
	}
	return p
}

// add pools another pass's parts.
func (p *splitParts) add(q splitParts) {
	p.handoffs += q.handoffs
	p.split += q.split
	p.grants += q.grants
	p.heardFirst += q.heardFirst
	if p.parts == nil {
		p.parts = make([][]time.Duration, len(splitPartNames))
	}
	for k := range q.parts {
		p.parts[k] = append(p.parts[k], q.parts[k]...)
	}
	p.pings = append(p.pings, q.pings...)
	p.serverP50 = append(p.serverP50, q.serverP50...)
	p.serverP99 = append(p.serverP99, q.serverP99...)
}

// summary gives each part's quantiles.
func (p splitParts) summary() SplitParts {
	s := SplitParts{Handoffs: p.handoffs, Split: p.split, Grants: p.grants}
	if p.split > 0 {
		s.HeardFirst = float64(p.heardFirst) / float64(p.split)
	}
	slices.Sort(p.pings)
	s.PingP50 = float64(quantile(p.pings, 0.5))
	slices.Sort(p.serverP50)
	slices.Sort(p.serverP99)
	s.ServerP50, s.ServerP99 = float64(quantile(p.serverP50, 0.5)), float64(quantile(p.serverP99, 0.5))
	for k, name := range splitPartNames {
		var ds []time.Duration
		if k < len(p.parts) {
			ds = slices.Sorted(slices.Values(p.parts[k]))
		}
		s.Parts = append(s.Parts, SplitPart{Name: name, P50: float64(quantile(ds, 0.5)), P99: float64(quantile(ds, 0.99))})
	}
	return s
}

// splitPasses runs the hand-off split beside sc's contenders (S4), if
// lockreg is one of them: splitRounds passes of d each of lockreg and of
// the hand-off floor, probed, taking turns; the result goes to lockreg's
// row.
func (e *benchEnv) splitPasses(ctx context.Context, sc scenario, runs []*contenderRun, d time.Duration) {
	i := slices.IndexFunc(runs, func(run *contenderRun) bool { return run.f.Name == contenders.LockReg.Name && run.ok() })
	if i < 0 {
		return
	}
	split := &HandoffSplit{Rounds: splitRounds, Pass: float64(d)}
	runs[i].res.Split = split
	var lr, fl splitParts
	for round := range splitRounds {
		order := []string{contenders.LockReg.Name, contenders.HandoffFloorName}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			command := releasingCommand[name]
			// The server's latency figures, from this pass alone (S4's
			// timing passes, which read commandstats deltas, are over).
			err := e.admin.ConfigResetStat(ctx).Err()
			var l load
			if err == nil {
				l, err = e.workerProcesses(ctx, sc, name, e.addr, d, true)
			}
			var p50, p99 time.Duration
			if err == nil {
				p50, p99, err = commandLatency(ctx, e.admin, command)
			}
			if err != nil {
				split.Err = fmt.Sprintf("%s: %v", name, err)
				fmt.Fprintln(os.Stderr, "S4 hand-off split:", split.Err)
				return
			}
			p := splitHandoffs(l.holds)
			p.pings = []time.Duration{l.pingP50} // one per pass: the passes' p50s, pooled by their median
			p.serverP50, p.serverP99 = []time.Duration{p50}, []time.Duration{p99}
			if name == contenders.LockReg.Name {
				lr.add(p)
			} else {
				fl.add(p)
			}
		}
	}
	split.LockReg, split.Floor = lr.summary(), fl.summary()
	split.LockReg.Command, split.Floor.Command = releasingCommand[contenders.LockReg.Name], releasingCommand[contenders.HandoffFloorName]
}

// releasingCommand is the command that passes the key on, by contender.
var releasingCommand = map[string]string{contenders.LockReg.Name: "evalsha", contenders.HandoffFloorName: "publish"}

// commandLatency reads command's p50 and p99 off INFO latencystats
// (Redis 7 and later; zero, without error, where the server has none).
func commandLatency(ctx context.Context, admin *redis.Client, command string) (p50, p99 time.Duration, err error) {
	info, err := admin.Info(ctx, "latencystats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		// latency_percentiles_usec_evalsha:p50=20.095,p99=50.175,p99.9=100.351
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "latency_percentiles_usec_"+command+":")
		if !ok {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			name, value, _ := strings.Cut(field, "=")
			usec, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO latencystats: cannot read %q", line)
			}
			switch name {
			case "p50":
				p50 = time.Duration(usec * 1e3)
			case "p99":
				p99 = time.Duration(usec * 1e3)
			}
		}
	}
	return p50, p99, nil
}

// splitMarkdown is RESULTS.md's account of the hand-off split: each part
// of lockreg's hand-off, p50 and p99, in µs and as multiples of the
// floor's whole hand-off (its p50, and its p99), beside the floor's own
// part.
func splitMarkdown(s *HandoffSplit) string {
	if s == nil {
		return ""
	}
	out := fmt.Sprintf("\nThe hand-off's parts: %d passes each of lockreg and of the floor, %v each, taking turns, in which the worker processes were probed: a go-redis hook on each process's client timed the releasing call (lockreg's release.lua, the floor's PUBLISH), and each connection it dialed, the subscription's included, was wrapped to note when a grant (the floor's baton) was read off it. "+
		"Only hand-offs between processes count; a hand-off is split when the release made a call and the next process heard the grant between that call's sending and its hold. "+
		"The multiples are of the floor's whole hand-off in its probed passes: p50 over its p50, p99 over its p99. "+
		"The last row is INFO latencystats of the releasing command, reset before each pass (the median of the passes' p50s and p99s): lockreg's EVALSHAs are mostly its granting releases, but its attempts and renewals count too.\n\n", s.Rounds, time.Duration(s.Pass))
	if s.Err != "" {
		return out + "error: " + s.Err + "\n"
	}
	lr, fl := s.LockReg, s.Floor
	whole := len(splitPartNames) - 1
	if len(lr.Parts) != len(splitPartNames) || len(fl.Parts) != len(splitPartNames) || fl.Parts[whole].P50 <= 0 {
		return out + "(nothing split: no hand-off of the floor's could be)\n"
	}
	floorP50, floorP99 := fl.Parts[whole].P50, fl.Parts[whole].P99
	out += "| part | lockreg p50 / p99 (µs) | x floor's hand-off p50 / p99 | the floor's own part p50 / p99 (µs) |\n| --- | ---: | ---: | ---: |\n"
	for k, name := range splitPartNames {
		l, f := lr.Parts[k], fl.Parts[k]
		out += fmt.Sprintf("| %s | %.0f / %.0f | %.2f / %.2f | %.0f / %.0f |\n", name, l.P50/1e3, l.P99/1e3, l.P50/floorP50, l.P99/floorP99, f.P50/1e3, f.P99/1e3)
	}
	if lr.ServerP50 > 0 && fl.ServerP50 > 0 {
		out += fmt.Sprintf("| … of the call, the releasing command's own time in Redis (%s; the floor: %s) | %.0f / %.0f | %.2f / %.2f | %.0f / %.0f |\n",
			lr.Command, fl.Command, lr.ServerP50/1e3, lr.ServerP99/1e3, lr.ServerP50/floorP50, lr.ServerP99/floorP99, fl.ServerP50/1e3, fl.ServerP99/1e3)
	}
	share := func(p SplitParts) string {
		if p.Handoffs == 0 {
			return "no hand-offs"
		}
		return fmt.Sprintf("%d hand-offs between processes, %d split (%.0f%%), the grant heard before the releaser's reply in %.0f%% of those; PING p50 %.0f µs", p.Handoffs, p.Split, 100*float64(p.Split)/float64(p.Handoffs), 100*p.HeardFirst, p.PingP50/1e3)
	}
	out += fmt.Sprintf("\n- lockreg: %s; %d of the hand-offs (%.0f%%) were grants\n- the floor: %s\n", share(lr), lr.Grants, 100*float64(lr.Grants)/float64(max(lr.Handoffs, 1)), share(fl))
	return out
}
