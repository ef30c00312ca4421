package main

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/resilienthttp/resilience"
)

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const page = "# A page\n" +
	"\n" +
	"```sh\n" +
	"go test ./...\n" +
	"```\n" +
	"\n" +
	"<!-- go: imports net/http, time; given url string -->\n" +
	"```go\n" +
	"resp, err := http.Get(url)\n" +
	"if err != nil {\n" +
	"\treturn err\n" +
	"}\n" +
	"defer resp.Body.Close()\n" +
	"```\n" +
	"\n" +
	"```go\n" +
	"package main\n" +
	"\n" +
	"func main() {}\n" +
	"```\n" +
	"\n" +
	"```Go\n" +
	"type T struct{ A int }\n" +
	"```\n"

func TestExtract(t *testing.T) {
	path := writeFile(t, t.TempDir(), "page.md", page)
	blocks, err := extract(path, "page.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 3 {
		t.Fatalf("got %d blocks, want 3 (the sh block is not Go)", len(blocks))
	}
	b := blocks[0]
	if b.n != 1 || b.fence != 8 || b.dir.line != 7 || b.firstLine() != 9 {
		t.Errorf("block 1: n %d, fence %d, directive %d, first line %d; want 1, 8, 7, 9", b.n, b.fence, b.dir.line, b.firstLine())
	}
	if !reflect.DeepEqual(b.dir.imports, []string{"net/http", "time"}) || b.dir.given != "url string" {
		t.Errorf("block 1's directive: %+v", b.dir)
	}
	if !strings.HasPrefix(b.code, "resp, err := http.Get(url)\n") || !strings.HasSuffix(b.code, "defer resp.Body.Close()\n") {
		t.Errorf("block 1's code: %q", b.code)
	}
	if blocks[1].dir.line != 0 || blocks[2].n != 3 {
		t.Errorf("blocks 2 and 3: %+v %+v", blocks[1], blocks[2])
	}
	want := []kind{fragment, program, declarations}
	for i, b := range blocks {
		if err := classify(b); err != nil {
			t.Errorf("classify %v: %v", b, err)
		}
		if b.kind != want[i] {
			t.Errorf("%v is a %v, want %v", b, b.kind, want[i])
		}
	}
	if got := b.String(); got != "page.md, Go block 1 (line 8)" {
		t.Errorf("String() = %q", got)
	}
}

func TestExtractRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"unclosed":            "```go\nx := 1\n",
		"directive not next":  "<!-- go: imports fmt -->\n\n```go\nfmt.Println()\n```\n",
		"directive on sh":     "<!-- go: imports fmt -->\n```sh\nls\n```\n",
		"directive at end":    "text\n<!-- go: imports fmt -->\n",
		"unknown clause":      "<!-- go: import fmt -->\n```go\nfmt.Println()\n```\n",
		"empty clause":        "<!-- go: imports -->\n```go\nfmt.Println()\n```\n",
		"bad import path":     "<!-- go: imports \"fmt\" -->\n```go\nfmt.Println()\n```\n",
		"quote with imports":  "<!-- go: quotes x; imports fmt -->\n```go\ntype T int\n```\n",
		"two-line directive":  "<!-- go: imports fmt\n-->\n```go\nfmt.Println()\n```\n",
		"indented go block":   "- item\n\n  ```go\n  x := 1\n  ```\n",
		"imports given twice": "<!-- go: imports fmt; imports os -->\n```go\nfmt.Println()\n```\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "page.md", text)
			if _, err := extract(path, "page.md"); err == nil {
				t.Errorf("extract accepted %q", text)
			} else if !strings.HasPrefix(err.Error(), "page.md:") {
				t.Errorf("the error does not name the file and line: %v", err)
			}
		})
	}
}

func TestClassifyRefuses(t *testing.T) {
	for _, tc := range []struct {
		code string
		dir  directive
		line string // of the message
	}{
		{"$ go test ./...\n", directive{}, "page.md:11:1:"},
		{"x := 1\n...\n", directive{}, "page.md:12:1:"},
		{"package main\n\nfunc main() {\n", directive{}, "page.md:"},
		{"package main\n\nfunc main() {}\n", directive{line: 9, imports: []string{"fmt"}}, "page.md, Go block 1"},
		{"x := 1\n", directive{line: 9, quotes: "example.com/p"}, "page.md:11:"},
	} {
		b := &block{file: "page.md", n: 1, fence: 10, code: tc.code, dir: tc.dir}
		err := classify(b)
		if err == nil {
			t.Errorf("classify accepted %q", tc.code)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.line) {
			t.Errorf("classify %q: %v; want a message starting %q", tc.code, err, tc.line)
		}
	}
}

func TestSource(t *testing.T) {
	b := &block{file: "page.md", n: 1, fence: 10, kind: fragment,
		code: "x, err := f()\nif err != nil {\n\treturn err\n}\nvar y, _ = 1, 2\n",
		dir:  directive{line: 9, imports: []string{"fmt"}, given: "f func() (int, error)"}}
	got := source(b, "/abs/page.md")
	want := "//line /abs/page.md:10:1\npackage doc\n\n" +
		"//line /abs/page.md:9:1\nimport \"fmt\"\n" +
		"//line /abs/page.md:9:1\nfunc _(f func() (int, error)) error {\n" +
		"//line /abs/page.md:11:1\n" + b.code +
		"//line /abs/page.md:16:1\n\t_ = x\n\t_ = y\n\treturn nil\n}\n"
	if got != want {
		t.Errorf("source:\n%s\nwant:\n%s", got, want)
	}
	// The positions are the Markdown's.
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "block.go", got, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ret *ast.ReturnStmt
	ast.Inspect(f, func(n ast.Node) bool {
		if r, ok := n.(*ast.ReturnStmt); ok && ret == nil {
			ret = r
		}
		return true
	})
	if p := fset.Position(ret.Pos()); p.Filename != "/abs/page.md" || p.Line != 13 || p.Column != 2 {
		t.Errorf("return err is at %v, want /abs/page.md:13:2", p)
	}

	// Nothing follows a fragment's last return: vet would call it unreachable.
	b.code = "return nil\n"
	if got := source(b, "/abs/page.md"); strings.Contains(got, "_ =") || strings.Count(got, "return") != 1 {
		t.Errorf("source of a fragment that returns:\n%s", got)
	}
}

func TestDeclaredNames(t *testing.T) {
	got := declaredNames("a, err := f()\n_, b := g()\nvar c, d int\nvar err2 error\nc = 1\nif true {\n\te := 1\n}\na, z := h()\n")
	want := []string{"a", "b", "c", "d", "err2", "z"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("declaredNames = %v, want %v (never err, nor what a nested block declares)", got, want)
	}
}

func TestCheckQuote(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "p/p.go", `package p

import "context"

// A Store stores.
type Store interface {
	// Get gets.
	Get(ctx context.Context, key string) (string, bool)

	// Put puts.
	Put(ctx context.Context, key string)
}

// F does nothing.
func F(x int) int { return x }
`)
	writeFile(t, dir, "p/p_test.go", "package p\n\ntype OnlyInTests int\n")
	mods := map[string]string{"example.com/m": dir}
	for code, ok := range map[string]bool{
		"type Store interface {\n\tGet(ctx context.Context, key string) (string, bool)\n\tPut(ctx context.Context, key string)\n}\n": true,
		"func F(x int) int { return x }\n":                                                   true,
		"type Store interface {\n\tGet(ctx context.Context, key string) (string, bool)\n}\n": false,
		"func F(y int) int { return y }\n":                                                   false,
		"type OnlyInTests int\n":                                                             false,
	} {
		b := &block{file: "page.md", n: 1, fence: 3, code: code, dir: directive{line: 2, quotes: "example.com/m/p"}, kind: quote}
		err := checkQuote(b, mods)
		if ok && err != nil {
			t.Errorf("quote %q: %v", code, err)
		} else if !ok && err == nil {
			t.Errorf("quote %q passed", code)
		}
	}
	b := &block{file: "page.md", n: 1, fence: 3, code: "type T int\n", dir: directive{line: 2, quotes: "example.com/other"}, kind: quote}
	if err := checkQuote(b, mods); err == nil {
		t.Error("a quote of a package outside the checkout passed")
	}
}

func TestUnclosed(t *testing.T) {
	const src = `package p

import "net/http"

func closes(c *http.Client) error {
	resp, err := c.Get("http://x")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return nil
}

func closesLater(c *http.Client) {
	var resp *http.Response
	resp, _ = c.Get("http://x")
	resp.Body.Close()
}

func leaks(c *http.Client) {
	leaked, _ := c.Get("http://x")
	_ = leaked.Status
}

func discards(c *http.Client, req *http.Request) {
	_, _ = c.Do(req)
	c.Do(req)
}

func takesOne(resp *http.Response) { _ = resp.Status } // a parameter is not its to close
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", nil)}
	if _, err := conf.Check("p", fset, []*ast.File{f}, info); err != nil {
		t.Fatal(err)
	}
	got := unclosed(fset, f, info)
	want := []string{
		"p.go:21:2: leaked's body is never closed (defer leaked.Body.Close())",
		"p.go:26:2: a response is discarded: its body is never closed",
		"p.go:27:2: a response is discarded: its body is never closed",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("unclosed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMarkdownPositions(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "docs/x/block1/block.go", "//line /abs/x.md:7:1\npackage doc\n\n//line /abs/x.md:9:1\nfunc _() {\n}\n")
	got := string(markdownPositions([]byte("docs/x/block1/block.go:5:1: something (SA0000)\n"), dir))
	if want := "/abs/x.md:9:1: something (SA0000)\n"; got != want {
		t.Errorf("markdownPositions = %q, want %q", got, want)
	}
}

func TestBlame(t *testing.T) {
	b1 := &block{file: "docs/a.md", n: 1, fence: 10, code: "x\ny\n", dir: directive{line: 9}}
	b2 := &block{file: "docs/a.md", n: 2, fence: 20, code: "x\n"}
	byPkg := map[string]*block{"doccheck/docs/a/block1": b1, "doccheck/docs/a/block2": b2}
	got := blame([]byte("docs/a.md:9:3: \"fmt\" imported and not used\n"), byPkg)
	if !reflect.DeepEqual(got, map[string]bool{"doccheck/docs/a/block1": true}) {
		t.Errorf("blame by position = %v", got)
	}
	got = blame([]byte("# doccheck/docs/a/block2\nvet: something\n"), byPkg)
	if !reflect.DeepEqual(got, map[string]bool{"doccheck/docs/a/block2": true}) {
		t.Errorf("blame by package = %v", got)
	}
}

func TestPkgDir(t *testing.T) {
	if got := pkgDir(&block{file: "docs/getting-started.md", n: 2}); got != "docs/getting-started/block2" {
		t.Errorf("pkgDir = %q", got)
	}
	if got := pkgDir(&block{file: "README.md", n: 1}); got != "README/block1" {
		t.Errorf("pkgDir = %q", got)
	}
}

func TestRelative(t *testing.T) {
	out := []byte("/tmp/repo/docs/a.md:3:1: x\n../repo/docs/b.md:4:1: y\n")
	if got, want := relative(out, "/tmp/repo", "/tmp/doccheck1"), "docs/a.md:3:1: x\ndocs/b.md:4:1: y\n"; got != want {
		t.Errorf("relative = %q, want %q", got, want)
	}
}

// run checks the JSON blocks as well as the Go ones: a configuration that
// LoadConfig refuses, or a health report that is not the shape the handler
// serves, fails the run and is named by file and line.
func TestRunChecksJSONBlocks(t *testing.T) {
	for name, tc := range map[string]struct{ page, want string }{
		"config LoadConfig refuses": {
			"# Hedging\n\n```json\n{\"upstreams\": {\"orders\": {\"hedging\": {\"enabled\": true, \"routing\": \"weighted\"}}}}\n```\n",
			"page.md, JSON block 1 (line 3)",
		},
		"health of the old shape": {
			"# Health\n\ntext\n\n<!-- json: health -->\n```json\n{\"status\":\"healthy\",\"handlers\":{\"a\":{\"circuit\":\"closed\",\"overload\":{\"\":{\"limit\":20,\"inFlight\":0,\"queued\":0,\"latency\":0,\"refused\":0,\"overloaded\":false}}}}}\n```\n",
			"page.md, JSON block 1 (line 6)",
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "go.mod", "module example.com/m\n\ngo 1.25\n")
			writeFile(t, dir, "page.md", tc.page)
			t.Chdir(dir)
			err := run([]string{"page.md"}, false)
			if err == nil {
				t.Fatalf("run accepted a page whose JSON block is wrong:\n%s", tc.page)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run: %v; want the failing block named %q", err, tc.want)
			}
		})
	}
}

func TestExtractJSON(t *testing.T) {
	const text = "# A page\n" +
		"\n" +
		"```go\n" +
		"x := `\n" +
		"```\n" +
		"\n" +
		"```json\n" +
		"{\"upstreams\": {\"a\": {}}}\n" +
		"```\n" +
		"\n" +
		"<!-- json: health -->\n" +
		"```JSON\n" +
		"{\"status\": \"healthy\",\n" +
		" \"handlers\": {}}\n" +
		"```\n"
	path := writeFile(t, t.TempDir(), "page.md", text)
	blocks, err := extractJSON(path, "page.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 {
		t.Fatalf("got %d JSON blocks, want 2 (the go block is not JSON)", len(blocks))
	}
	if b := blocks[0]; b.n != 1 || b.fence != 7 || b.dirLine != 0 || b.kind != jsonConfig || b.code != "{\"upstreams\": {\"a\": {}}}\n" {
		t.Errorf("block 1: %+v", b)
	}
	if b := blocks[1]; b.n != 2 || b.fence != 12 || b.dirLine != 11 || b.kind != "health" || !strings.HasSuffix(b.code, "\"handlers\": {}}\n") {
		t.Errorf("block 2: %+v", b)
	}
	if got := blocks[1].String(); got != "page.md, JSON block 2 (line 12)" {
		t.Errorf("String() = %q", got)
	}
}

func TestExtractJSONRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"unclosed":           "```json\n{}\n",
		"directive not next": "<!-- json: health -->\n\n```json\n{}\n```\n",
		"directive on go":    "<!-- json: health -->\n```go\nx := 1\n```\n",
		"directive at end":   "text\n<!-- json: health -->\n",
		"unknown kind":       "<!-- json: metrics -->\n```json\n{}\n```\n",
		"config named":       "<!-- json: config -->\n```json\n{}\n```\n",
		"two-line directive": "<!-- json: health\n-->\n```json\n{}\n```\n",
		"indented":           "- item\n\n  ```json\n  {}\n  ```\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "page.md", text)
			if _, err := extractJSON(path, "page.md"); err == nil {
				t.Errorf("extractJSON accepted %q", text)
			} else if !strings.HasPrefix(err.Error(), "page.md:") {
				t.Errorf("the error does not name the file and line: %v", err)
			}
		})
	}
}

// realHealth is a health report as HealthHandler serves it, of a handler
// with PerHost and one without.
func realHealth(t *testing.T) string {
	t.Helper()
	single, err := resilience.NewHandler(resilience.Options{Name: "single"})
	if err != nil {
		t.Fatal(err)
	}
	perHost, err := resilience.NewHandler(resilience.Options{Name: "perhost", PerHost: resilience.PerHostOptions{Enabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	single.IsolateCircuit()
	rec := httptest.NewRecorder()
	resilience.HealthHandler(single, perHost).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	return rec.Body.String()
}

func TestCheckJSON(t *testing.T) {
	health := realHealth(t)
	if !strings.Contains(health, `"latencyMs":0`) {
		t.Fatalf("the real report has changed shape; update the cases below: %s", health)
	}
	for _, tc := range []struct {
		kind, code string
		want       string // in the error; "" if the block passes
	}{
		{jsonConfig, `{"upstreams": {"a": {"retry": {"delay": "1ms"}}}}`, ""},
		{jsonConfig, "{\"upstreams\": {\"a\": {\n\"retry\": {\"delay\": \"1ms\"},,\n}}}", "page.md:12:"}, // the syntax error's own line
		{jsonConfig, `{"upstreams": {"a": {"retry": {"delay": "2x"}}}}`, `upstreams.a.retry.delay`},
		{jsonConfig, `"orders": {"hedging": {"enabled": true}}`, "more than one JSON value"},
		{jsonConfig, ``, "empty"},
		{jsonConfig, health, "does not load with resilience.LoadConfig"}, // a health report not marked as one
		{"health", health, ""},
		{"health", strings.Replace(health, `"latencyMs":0`, `"latency":0`, 1), `overload.latency: the type has no such field`},
		{"health", strings.Replace(health, `"queued":0,`, ``, 1), `overload.queued: missing from the block`},
		{"health", strings.Replace(health, `"circuit":"closed"`, `"circuit":"closed","extra":1`, 1), `unknown field "extra"`},
		{"health", strings.Replace(health, `"limit":20`, `"limit":"20"`, 1), `not a resilience.Health`},
		{"health", `{"upstreams": {"a": {}}}`, `unknown field "upstreams"`},
	} {
		b := &jsonBlock{file: "page.md", n: 1, fence: 10, kind: tc.kind, code: tc.code + "\n"}
		err := checkJSON(b)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s block %q: %v", tc.kind, tc.code, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s block %q passed; want an error with %q", tc.kind, tc.code, tc.want)
		case err != nil && (!strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "page.md:")):
			t.Errorf("%s block %q: %v; want the file and line, and %q", tc.kind, tc.code, err, tc.want)
		}
	}
}
