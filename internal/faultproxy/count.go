package faultproxy

import "bytes"

// The parser's states.
const (
	stCommand  = iota // at the start of a command
	stArrayLen        // in "*<n>\r\n", after the '*'
	stElement         // at the start of an array element
	stBulkLen         // in "$<n>\r\n", after the '$'
	stBulkBody        // in a bulk string's payload and its CRLF
	stLine            // in an array element that is not a bulk string, up to '\n'
	stInline          // in an inline command, up to '\n'
)

// maxLen caps the lengths parsed, so that garbage cannot overflow them.
const maxLen = 1 << 40

// parser counts the commands in a client's RESP stream, fed as it arrives
// in pieces of any size; a command may span pieces.
type parser struct {
	state    int
	n        int64 // the length being parsed
	neg      bool  // the length being parsed is negative
	elems    int64 // elements left in the current array
	skip     int64 // bytes left in the current bulk string, CRLF included
	nonEmpty bool  // the current inline command has a non-blank byte
}

// feed parses the next piece of the stream and returns how many commands
// it completed. As Redis does, it counts no empty arrays ("*0", "*-1") and
// no blank inline lines.
func (ps *parser) feed(b []byte) (commands int64) {
	for i := 0; i < len(b); {
		switch ps.state {
		case stCommand:
			switch b[i] {
			case '*':
				ps.state, ps.n, ps.neg = stArrayLen, 0, false
				i++
			default:
				ps.state, ps.nonEmpty = stInline, false
			}
		case stArrayLen, stBulkLen:
			c := b[i]
			i++
			switch {
			case c >= '0' && c <= '9':
				if ps.n < maxLen {
					ps.n = ps.n*10 + int64(c-'0')
				}
				continue
			case c == '-':
				ps.neg = true
				continue
			case c != '\n':
				continue // '\r', or garbage Redis would refuse
			}
			if ps.state == stArrayLen {
				if ps.neg || ps.n == 0 {
					ps.state = stCommand
				} else {
					ps.elems, ps.state = ps.n, stElement
				}
			} else if ps.neg { // a null bulk string
				commands += ps.elementDone()
			} else {
				ps.skip, ps.state = ps.n+2, stBulkBody
			}
		case stBulkBody:
			take := min(ps.skip, int64(len(b)-i))
			i += int(take)
			if ps.skip -= take; ps.skip == 0 {
				commands += ps.elementDone()
			}
		case stElement:
			if b[i] == '$' {
				ps.state, ps.n, ps.neg = stBulkLen, 0, false
			} else {
				ps.state = stLine
			}
			i++
		case stLine:
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				i = len(b)
				continue
			}
			i += j + 1
			commands += ps.elementDone()
		case stInline:
			j := bytes.IndexByte(b[i:], '\n')
			end := len(b)
			if j >= 0 {
				end = i + j
			}
			if !ps.nonEmpty && len(bytes.Trim(b[i:end], " \t\r")) > 0 {
				ps.nonEmpty = true
			}
			if j < 0 {
				i = len(b)
				continue
			}
			i = end + 1
			if ps.nonEmpty {
				commands++
			}
			ps.state = stCommand
		}
	}
	return commands
}

// elementDone ends an array element and reports whether it ended the
// command.
func (ps *parser) elementDone() int64 {
	if ps.elems--; ps.elems > 0 {
		ps.state = stElement
		return 0
	}
	ps.state = stCommand
	return 1
}
