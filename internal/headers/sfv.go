package headers

// A reader of the subset of HTTP structured fields (RFC 9651) that the
// quota headers use: Lists of Items with Parameters, and Dictionaries. It
// returns substrings of its input and never allocates. Numbers are read in
// thousandths (a Decimal has at most three fractional digits), saturating
// at maxQuotaDigits integer digits instead of failing, so that a huge value
// is clamped rather than ignored. Inner Lists are not read: a field that
// has one is malformed for the quota headers.

// sfParser reads s from i.
type sfParser struct {
	s string
	i int
}

// An sfValue is a Bare Item: a String or Token (text), an Integer or
// Decimal (num, in thousandths; isNum), a Byte Sequence (its base64 text;
// isBytes), or a Boolean (neither).
type sfValue struct {
	text    string
	num     int64
	isNum   bool
	isBytes bool
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

// number reads an Integer or Decimal, in thousandths; a negative one is
// read, and returned negative.
func (p *sfParser) number() (int64, bool) {
	neg := false
	if p.i < len(p.s) && p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	const most = 1e15 * 1000 // 15 nines and more saturate here
	var n int64
	digits := 0
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		if n < most {
			n = n*10 + int64(p.s[p.i]-'0')
		}
		digits++
		p.i++
	}
	if digits == 0 {
		return 0, false
	}
	n = min(n, most/1000) * 1000
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		scale := int64(100)
		frac := 0
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			if frac++; frac > 3 {
				return 0, false
			}
			n += int64(p.s[p.i]-'0') * scale
			scale /= 10
			p.i++
		}
		if frac == 0 {
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }

func isAlpha(c byte) bool { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }

// isTChar reports whether c is an RFC 9110 tchar.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// bareItem reads a Bare Item. A String's text is its content as sent,
// escapes included.
func (p *sfParser) bareItem() (sfValue, bool) {
	if p.done() {
		return sfValue{}, false
	}
	start := p.i
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		n, ok := p.number()
		return sfValue{text: p.s[start:p.i], num: n, isNum: true}, ok
	case c == '"':
		p.i++
		for p.i < len(p.s) {
			switch c := p.s[p.i]; {
			case c == '\\':
				if p.i+1 >= len(p.s) || (p.s[p.i+1] != '"' && p.s[p.i+1] != '\\') {
					return sfValue{}, false
				}
				p.i += 2
			case c == '"':
				p.i++
				return sfValue{text: p.s[start+1 : p.i-1]}, true
			case c < 0x20 || c > 0x7e:
				return sfValue{}, false
			default:
				p.i++
			}
		}
		return sfValue{}, false
	case isAlpha(c) || c == '*':
		for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return sfValue{text: p.s[start:p.i]}, true
	case c == ':': // Byte Sequence
		p.i++
		for p.i < len(p.s) && p.s[p.i] != ':' {
			if c := p.s[p.i]; !isAlpha(c) && !isDigit(c) && c != '+' && c != '/' && c != '=' {
				return sfValue{}, false
			}
			p.i++
		}
		if p.done() {
			return sfValue{}, false
		}
		p.i++
		return sfValue{text: p.s[start+1 : p.i-1], isBytes: true}, true
	case c == '?': // Boolean
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return sfValue{}, true
		}
	}
	return sfValue{}, false
}

// key reads a Key.
func (p *sfParser) key() (string, bool) {
	start := p.i
	if p.done() || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", false
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isLCAlpha(c) && !isDigit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

// params reads an item's Parameters and returns them, to be read with
// sfParams.next.
func (p *sfParser) params() (sfParams, bool) {
	start := p.i
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		if _, ok := p.key(); !ok {
			return sfParams{}, false
		}
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if _, ok := p.bareItem(); !ok {
				return sfParams{}, false
			}
		}
	}
	return sfParams{sfParser{s: p.s[start:p.i]}}, true
}

// endMember reads what follows a List or Dictionary member: the end, or a
// comma and another member.
func (p *sfParser) endMember() bool {
	p.skipOWS()
	if p.done() {
		return true
	}
	if p.s[p.i] != ',' {
		return false
	}
	p.i++
	p.skipOWS()
	return !p.done() // a trailing comma is malformed
}

// listItem reads a List member that is an Item: its Bare Item's text (a
// Number's as sent) and its Parameters.
func (p *sfParser) listItem() (string, sfParams, bool) {
	p.skipOWS()
	v, ok := p.bareItem()
	if !ok {
		return "", sfParams{}, false
	}
	params, ok := p.params()
	if !ok || !p.endMember() {
		return "", sfParams{}, false
	}
	return v.text, params, true
}

// dictMember reads a Dictionary member: its key, and its value when that
// is a Number (-1 otherwise; a negative Number is read as -1 too).
func (p *sfParser) dictMember() (string, int64, bool) {
	p.skipOWS()
	k, ok := p.key()
	if !ok {
		return "", 0, false
	}
	n := int64(-1)
	if p.i < len(p.s) && p.s[p.i] == '=' {
		p.i++
		v, ok := p.bareItem()
		if !ok {
			return "", 0, false
		}
		if v.isNum && v.num >= 0 {
			n = v.num
		}
	}
	if _, ok := p.params(); !ok || !p.endMember() {
		return "", 0, false
	}
	return k, n, true
}

// sfParams are an item's Parameters, already checked.
type sfParams struct{ p sfParser }

// next returns the next parameter's key and value, or false after the last.
func (ps *sfParams) next() (string, sfValue, bool) {
	p := &ps.p
	if p.done() {
		return "", sfValue{}, false
	}
	p.i++ // ';'
	p.skipSP()
	k, _ := p.key()
	v := sfValue{text: "?1"} // a parameter without a value is Boolean true
	if p.i < len(p.s) && p.s[p.i] == '=' {
		p.i++
		v, _ = p.bareItem()
	}
	return k, v, true
}
