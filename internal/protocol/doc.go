// Package protocol is lockreg's wire protocol, the one place in Go that
// knows what a registry keeps in Redis and says on it: the key scheme, the
// scripts with their arguments and replies, the waiting mark, the owner
// hash, the channels and their notifications, and the pipelines that carry
// calls to each node. docs/PROTOCOL.md describes it, rule by rule, with the
// test that checks each.
//
// Registries of every version that share a namespace speak it to each
// other: changing a key, an argument's meaning, the mark or a payload
// breaks a rolling deploy. The package decides nothing about holds: the
// lockreg package says when to call and what a reply means for a hold;
// this one says how a call is spelled and how its reply reads.
//
// The Lua scripts live at the repository's root, where lockreg embeds them
// and hands their text to NewScripts; the package imports nothing of
// lockreg's.
package protocol
