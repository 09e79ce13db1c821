package lockreg

import (
	_ "embed"

	"github.com/lockreg/lockreg/internal/protocol"
)

// The Lua scripts live here, beside obtain.lua, and internal/protocol
// knows their arguments and replies: the root only embeds their text.
var (
	//go:embed drawtoken.lua
	drawTokenLua string
	//go:embed markwaiting.lua
	markWaitingLua string
	//go:embed obtain.lua
	obtainLua string
	//go:embed release.lua
	releaseLua string
	//go:embed token.lua
	tokenLua string
	//go:embed renew.lua
	renewLua string
	//go:embed forceunlock.lua
	forceUnlockLua string
	//go:embed raisefence.lua
	raiseFenceLua string

	scripts = protocol.NewScripts(protocol.Sources{
		DrawToken: drawTokenLua, MarkWaiting: markWaitingLua,
		Obtain: obtainLua, Release: releaseLua, Token: tokenLua, Renew: renewLua, ForceUnlock: forceUnlockLua,
		RaiseFence: raiseFenceLua,
	})
)
