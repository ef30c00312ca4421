package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// A block is one ```go block of a Markdown file.
type block struct {
	file  string // as named on the command line, slash-separated
	n     int    // its place among the file's Go blocks, from 1
	fence int    // the line of its opening fence
	code  string // its text, without the fences
	dir   directive
	kind  kind
}

func (b *block) String() string {
	return fmt.Sprintf("%s, Go block %d (line %d)", b.file, b.n, b.fence)
}

// firstLine is the Markdown line of the block's first line of code.
func (b *block) firstLine() int { return b.fence + 1 }

// directive is what the HTML comment just before a block says about it:
//
//	<!-- go: imports context, net/http; given ctx context.Context, url string -->
//	<!-- go: quotes github.com/resilienthttp/resilience -->
type directive struct {
	line    int      // 0 if there is none
	imports []string // import paths
	given   string   // a Go parameter list: what the text around a fragment provides
	quotes  string   // the import path of the package whose declarations the block quotes
}

type kind int

const (
	program      kind = iota + 1 // a whole file: package clause, imports, declarations
	declarations                 // top-level declarations without a package clause
	fragment                     // statements, as in a function body
	quote                        // declarations copied from a package's source
)

func (k kind) String() string {
	return [...]string{"not Go", "program", "declarations", "fragment", "quote"}[k]
}

var (
	fenceOpen     = regexp.MustCompile("^```\\s*([A-Za-z0-9_+-]*)")
	directiveLine = regexp.MustCompile(`^<!--\s*go:(.*?)-->\s*$`)
)

// extract returns the Go blocks of the Markdown file, each with its
// directive, or the file's first error: an unclosed block, a directive
// that is not before a Go block or that does not parse.
func extract(path, name string) ([]*block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var (
		blocks  []*block
		cur     *block
		inOther bool // inside a block of another language
		pending directive
		lines   []string
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
			if lang == "go" || lang == "golang" {
				if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
					return nil, fmt.Errorf("%s:%d: an indented Go block: doccheck reads only blocks whose fence starts the line", name, n)
				}
				cur = &block{file: name, n: len(blocks) + 1, fence: n, dir: pending}
			} else {
				if pending.line != 0 {
					return nil, fmt.Errorf("%s:%d: a go: directive before a block that is not ```go", name, pending.line)
				}
				inOther = true
			}
			pending = directive{}
		default:
			if pending.line != 0 {
				return nil, fmt.Errorf("%s:%d: a go: directive must be the line just before a ```go block", name, pending.line)
			}
			if m := directiveLine.FindStringSubmatch(trimmed); m != nil {
				d, err := parseDirective(m[1])
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %v", name, n, err)
				}
				d.line = n
				pending = d
			} else if strings.HasPrefix(trimmed, "<!--") && strings.Contains(trimmed, "go:") {
				return nil, fmt.Errorf("%s:%d: a go: directive must be one line: <!-- go: ... -->", name, n)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: the Go block is never closed", name, cur.fence)
	}
	if pending.line != 0 {
		return nil, fmt.Errorf("%s:%d: a go: directive at the end of the file", name, pending.line)
	}
	return blocks, nil
}

// parseDirective parses what follows "go:" in a directive: clauses
// separated by semicolons, each a keyword and its value.
func parseDirective(s string) (directive, error) {
	var d directive
	for _, clause := range strings.Split(s, ";") {
		clause = strings.TrimSpace(clause)
		if clause == "" {
			continue
		}
		key, value, _ := strings.Cut(clause, " ")
		value = strings.TrimSpace(value)
		if value == "" {
			return d, fmt.Errorf("go: directive: %q needs a value", key)
		}
		switch key {
		case "imports":
			if d.imports != nil {
				return d, fmt.Errorf("go: directive: imports given twice")
			}
			for _, p := range strings.Split(value, ",") {
				p = strings.TrimSpace(p)
				if p == "" || strings.ContainsAny(p, " \t\"") {
					return d, fmt.Errorf("go: directive: imports: %q is not an import path", p)
				}
				d.imports = append(d.imports, p)
			}
		case "given":
			if d.given != "" {
				return d, fmt.Errorf("go: directive: given twice")
			}
			d.given = value
		case "quotes":
			if d.quotes != "" {
				return d, fmt.Errorf("go: directive: quotes given twice")
			}
			d.quotes = value
		default:
			return d, fmt.Errorf("go: directive: unknown clause %q (want imports, given or quotes)", key)
		}
	}
	if d.quotes != "" && (d.imports != nil || d.given != "") {
		return d, fmt.Errorf("go: directive: a quote is checked against its package's source and takes no imports or given")
	}
	return d, nil
}

// classify sets b.kind from what b.code parses as, or says why it is no Go.
func classify(b *block) error {
	fset := token.NewFileSet()
	src := b.code
	if f, err := parser.ParseFile(fset, "", src, parser.PackageClauseOnly); err == nil && f.Name != nil {
		if _, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution); err != nil {
			return b.parseError(err, 0)
		}
		if b.dir.line != 0 {
			return fmt.Errorf("%v: a block with a package clause has its own imports and takes no go: directive", b)
		}
		b.kind = program
		return nil
	}
	f, declErr := parser.ParseFile(fset, "", "package p\n"+src, parser.SkipObjectResolution)
	switch {
	case declErr == nil && len(f.Decls) == 0:
		return fmt.Errorf("%v: the block holds no code", b)
	case declErr == nil && b.dir.quotes != "":
		b.kind = quote
		return nil
	case declErr == nil:
		b.kind = declarations
		return nil
	case b.dir.quotes != "":
		return b.parseError(declErr, 1)
	}
	if _, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+src+"}\n", parser.SkipObjectResolution); err != nil {
		return b.parseError(err, 2)
	}
	b.kind = fragment
	return nil
}

// parseError names the Markdown line of a syntax error in b, whose code
// was parsed after offset lines of wrapping.
func (b *block) parseError(err error, offset int) error {
	if list, ok := err.(scanner.ErrorList); ok && len(list) > 0 {
		e := list[0]
		return fmt.Errorf("%s:%d:%d: %v: not Go (a program, declarations or statements): %s",
			b.file, b.firstLine()+e.Pos.Line-1-offset, e.Pos.Column, b, e.Msg)
	}
	return fmt.Errorf("%v: not Go: %v", b, err)
}

// declaredNames returns the names a fragment declares at its top level,
// but err: what it hands on to the text that follows, which the wrapper
// uses so that the compiler does not call them unused. An err that the
// fragment never reads is still an error: each example checks its errors.
func declaredNames(code string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+code+"}\n", parser.SkipObjectResolution)
	if err != nil {
		return nil
	}
	body := f.Decls[0].(*ast.FuncDecl).Body
	var names []string
	seen := map[string]bool{}
	add := func(id *ast.Ident) {
		if id.Name != "_" && id.Name != "err" && !seen[id.Name] {
			seen[id.Name] = true
			names = append(names, id.Name)
		}
	}
	for _, s := range body.List {
		switch s := s.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

// endsInReturn reports whether a fragment's last statement is a return,
// after which the wrapper adds nothing (vet would call it unreachable).
func endsInReturn(code string) bool {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+code+"}\n", parser.SkipObjectResolution)
	if err != nil {
		return false
	}
	list := f.Decls[0].(*ast.FuncDecl).Body.List
	if len(list) == 0 {
		return false
	}
	_, ok := list[len(list)-1].(*ast.ReturnStmt)
	return ok
}

// source returns the Go file that builds b. Its //line comments give
// every line the position of its Markdown line, under abs, the Markdown
// file's absolute path, so that the compiler's and vet's messages name the
// file and line of the block.
func source(b *block, abs string) string {
	var w strings.Builder
	at := func(line int) { fmt.Fprintf(&w, "//line %s:%d:1\n", abs, line) }
	dirLine := b.dir.line
	if dirLine == 0 {
		dirLine = b.fence
	}
	switch b.kind {
	case program:
		at(b.firstLine())
		w.WriteString(b.code)
		return w.String()
	case declarations, fragment:
		at(b.fence)
		w.WriteString("package doc\n\n")
		for _, p := range b.dir.imports {
			at(dirLine)
			fmt.Fprintf(&w, "import %q\n", p)
		}
	}
	if b.kind == declarations {
		at(b.firstLine())
		w.WriteString(b.code)
		return w.String()
	}
	at(dirLine)
	fmt.Fprintf(&w, "func _(%s) error {\n", b.dir.given)
	at(b.firstLine())
	w.WriteString(b.code)
	if !endsInReturn(b.code) {
		at(b.fence + strings.Count(b.code, "\n") + 1) // the closing fence
		for _, name := range declaredNames(b.code) {
			fmt.Fprintf(&w, "\t_ = %s\n", name)
		}
		w.WriteString("\treturn nil\n")
	}
	w.WriteString("}\n")
	return w.String()
}

// pkgDir is where b's package goes in the temporary module: one package
// per block, named after its file and place.
func pkgDir(b *block) string {
	name := strings.TrimSuffix(b.file, filepath.Ext(b.file))
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '/', r == '-', r == '_':
			return r
		}
		return '_'
	}, name)
	return fmt.Sprintf("%s/block%d", name, b.n)
}
