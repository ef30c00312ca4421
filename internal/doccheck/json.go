package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/resilienthttp/resilience"
)

// A jsonBlock is one ```json block of a Markdown file: a configuration
// file, which must load with resilience.LoadConfig, unless the HTML comment
// on the line just before it names another kind of JSON (jsonKinds).
type jsonBlock struct {
	file    string // as named on the command line, slash-separated
	n       int    // its place among the file's JSON blocks, from 1
	fence   int    // the line of its opening fence
	dirLine int    // the line of its json: directive, 0 if none
	kind    string // "config", or what its directive names
	code    string // its text, without the fences
}

func (b *jsonBlock) String() string {
	return fmt.Sprintf("%s, JSON block %d (line %d)", b.file, b.n, b.fence)
}

// jsonKinds are the kinds of JSON a directive may name, each with the
// check of a block of that kind. A block without a directive is a
// configuration file.
//
//	<!-- json: health -->
var jsonKinds = map[string]func(code string) error{
	"health": checkHealth,
}

// jsonConfig is the kind of a block without a directive.
const jsonConfig = "config"

var jsonDirectiveLine = regexp.MustCompile(`^<!--\s*json:(.*?)-->\s*$`)

// extractJSON returns the JSON blocks of the Markdown file, or the file's
// first error: an unclosed or indented block, or a json: directive that is
// not just before a JSON block or names no kind of JSON there is.
func extractJSON(path, name string) ([]*jsonBlock, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var (
		blocks  []*jsonBlock
		cur     *jsonBlock
		inOther bool // inside a block of another language
		pending struct {
			line int
			kind string
		}
		lines []string
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur != nil:
			if strings.HasPrefix(trimmed, "```") {
				cur.code = strings.Join(lines, "\n") + "\n"
				blocks = append(blocks, cur)
				cur, lines = nil, nil
				continue
			}
			lines = append(lines, line)
		case inOther:
			if strings.HasPrefix(trimmed, "```") {
				inOther = false
			}
		case fenceOpen.MatchString(trimmed):
			lang := strings.ToLower(fenceOpen.FindStringSubmatch(trimmed)[1])
			if lang == "json" {
				if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
					return nil, fmt.Errorf("%s:%d: an indented JSON block: doccheck reads only blocks whose fence starts the line", name, n)
				}
				cur = &jsonBlock{file: name, n: len(blocks) + 1, fence: n, dirLine: pending.line, kind: jsonConfig}
				if pending.line != 0 {
					cur.kind = pending.kind
				}
			} else {
				if pending.line != 0 {
					return nil, fmt.Errorf("%s:%d: a json: directive before a block that is not ```json", name, pending.line)
				}
				inOther = true
			}
			pending.line = 0
		default:
			if pending.line != 0 {
				return nil, fmt.Errorf("%s:%d: a json: directive must be the line just before a ```json block", name, pending.line)
			}
			if m := jsonDirectiveLine.FindStringSubmatch(trimmed); m != nil {
				kind := strings.TrimSpace(m[1])
				if jsonKinds[kind] == nil {
					return nil, fmt.Errorf("%s:%d: json: directive: %q is no kind of JSON doccheck knows (want %s; a configuration file takes no directive)",
						name, n, kind, strings.Join(sortedKinds(), " or "))
				}
				pending.line, pending.kind = n, kind
			} else if strings.HasPrefix(trimmed, "<!--") && strings.Contains(trimmed, "json:") {
				return nil, fmt.Errorf("%s:%d: a json: directive must be one line: <!-- json: kind -->", name, n)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: the JSON block is never closed", name, cur.fence)
	}
	if pending.line != 0 {
		return nil, fmt.Errorf("%s:%d: a json: directive at the end of the file", name, pending.line)
	}
	return blocks, nil
}

func sortedKinds() []string {
	kinds := make([]string, 0, len(jsonKinds))
	for k := range jsonKinds {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// checkJSON checks b as its kind says, and names its file and line.
func checkJSON(b *jsonBlock) error {
	if err := validJSON(b.code); err != nil {
		var syn *json.SyntaxError
		line := b.fence
		if errors.As(err, &syn) && syn.Offset > 0 && int(syn.Offset) <= len(b.code) {
			line = b.fence + 1 + strings.Count(b.code[:syn.Offset-1], "\n")
		}
		return fmt.Errorf("%s:%d: %v: invalid JSON: %v", b.file, line, b, err)
	}
	if b.kind == jsonConfig {
		if _, err := resilience.LoadConfig(strings.NewReader(b.code)); err != nil {
			var marks []string
			for _, k := range sortedKinds() {
				marks = append(marks, "<!-- json: "+k+" -->")
			}
			return fmt.Errorf("%s:%d: %v does not load with resilience.LoadConfig: %v "+
				"(a block that is another kind of JSON says which on the line before its fence: %s)",
				b.file, b.fence, b, err, strings.Join(marks, " or "))
		}
		return nil
	}
	if err := jsonKinds[b.kind](b.code); err != nil {
		return fmt.Errorf("%s:%d: %v, marked %s: %v", b.file, b.fence, b, b.kind, err)
	}
	return nil
}

// validJSON reports whether code is one JSON value and nothing else.
func validJSON(code string) error {
	d := json.NewDecoder(strings.NewReader(code))
	var v any
	if err := d.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the block is empty")
		}
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// checkHealth checks that code is a health report as HealthHandler serves
// it: it decodes into resilience.Health without an unknown field, and
// encodes back to the same JSON (key order and spacing aside), so that no
// field is missing, renamed, or of another shape or unit.
func checkHealth(code string) error {
	d := json.NewDecoder(strings.NewReader(code))
	d.DisallowUnknownFields()
	var h resilience.Health
	if err := d.Decode(&h); err != nil {
		return fmt.Errorf("not a resilience.Health: %v", err)
	}
	again, err := json.Marshal(h)
	if err != nil {
		return err
	}
	var want, got any
	if err := decodeNumbers(code, &want); err != nil {
		return err
	}
	if err := decodeNumbers(string(again), &got); err != nil {
		return err
	}
	if diff := jsonDiff("", want, got); diff != "" {
		return fmt.Errorf("not what resilience.Health encodes: %s", diff)
	}
	return nil
}

func decodeNumbers(code string, v any) error {
	d := json.NewDecoder(strings.NewReader(code))
	d.UseNumber()
	return d.Decode(v)
}

// jsonDiff returns the first difference between the block's JSON and what
// the Go type encodes, by path, or "".
func jsonDiff(path string, block, real any) string {
	at := path
	if at == "" {
		at = "the top level"
	}
	switch b := block.(type) {
	case map[string]any:
		r, ok := real.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: the block has an object, the type encodes %s", at, jsonText(real))
		}
		keys := make([]string, 0, len(b)+len(r))
		for k := range b {
			keys = append(keys, k)
		}
		for k := range r {
			if _, ok := b[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := path + "." + k
			switch {
			case !jsonName.MatchString(k):
				p = fmt.Sprintf("%s[%q]", path, k) // a host, or ""
			case path == "":
				p = k
			}
			bv, inBlock := b[k]
			rv, inReal := r[k]
			switch {
			case !inReal:
				return fmt.Sprintf("%s: the type has no such field, or it never encodes this value there", p)
			case !inBlock:
				return fmt.Sprintf("%s: missing from the block (the type encodes %s)", p, jsonText(rv))
			}
			if d := jsonDiff(p, bv, rv); d != "" {
				return d
			}
		}
		return ""
	case []any:
		r, ok := real.([]any)
		if !ok || len(r) != len(b) {
			return fmt.Sprintf("%s: the block has %s, the type encodes %s", at, jsonText(block), jsonText(real))
		}
		for i := range b {
			if d := jsonDiff(fmt.Sprintf("%s[%d]", path, i), b[i], r[i]); d != "" {
				return d
			}
		}
		return ""
	case json.Number:
		if r, ok := real.(json.Number); ok && sameNumber(b, r) {
			return ""
		}
	default:
		if block == real {
			return ""
		}
	}
	return fmt.Sprintf("%s: the block has %s, the type encodes %s", at, jsonText(block), jsonText(real))
}

// jsonName is a key that a path may write after a dot.
var jsonName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func sameNumber(a, b json.Number) bool {
	x, okx := new(big.Float).SetString(a.String())
	y, oky := new(big.Float).SetString(b.String())
	return okx && oky && x.Cmp(y) == 0
}

func jsonText(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(data) > 80 {
		return string(data[:77]) + "..."
	}
	return string(data)
}
