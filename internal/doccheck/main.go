// Command doccheck builds every ```go block of the given Markdown files
// against this checkout, and loads every ```json block, so that no example
// in the README or docs/ stops compiling or loading unnoticed. .ci/run runs it from the repository root:
//
//	go run ./internal/doccheck README.md docs/*.md
//
// Each block becomes one package of a temporary module, outside the
// workspace, that requires the checkout's modules as a user's module would,
// each replaced by its directory, and the module goes through go mod tidy,
// go build, go vet and staticcheck. A block is one of:
//
//   - a program: a whole file, package clause and imports included, built
//     as it stands. The README's first Go block must be one, a package
//     main: it is a newcomer's first program.
//   - declarations (types, functions, variables), compiled at the top
//     level of a package.
//   - a fragment: statements, compiled as the body of a function that
//     returns an error, so that a fragment may "return err". The names it
//     declares at its top level are used after it, since they are what it
//     hands on to the text that follows, but err: an err that a fragment
//     never reads is an error it does not check, and fails to compile.
//   - a quote of a package's own declarations, which must read as they do
//     in its source (comments aside).
//
// The HTML comment on the line just before a block, which Markdown does not
// show, says what a declarations block or fragment needs around it:
//
//	<!-- go: imports context, net/http, github.com/resilienthttp/resilience; given ctx context.Context, url string -->
//
// imports lists the packages it uses; given is the parameter list of the
// function a fragment is the body of: the values the text around it
// provides. A quote names its package instead:
//
//	<!-- go: quotes github.com/resilienthttp/resilience -->
//
// There is no way to skip a block: one that is not Go is not labelled go.
//
// Every ```json block is checked too, in process: a configuration file,
// which must load with resilience.LoadConfig, unless the HTML comment on
// the line just before it names another kind of JSON:
//
//	<!-- json: health -->
//
// marks a health report, which must decode into resilience.Health without
// an unknown field and encode back to the same JSON (key order, spacing and
// the spelling of numbers aside), so that a doc shows the real shape. A
// JSON block that is neither fails, named by file and line.
//
// Every message names the Markdown file and line (the generated files
// carry //line comments), and the failing blocks are listed by file and
// place. Besides what the compiler and vet check, every *http.Response an
// example gets from a call must have its body closed, and none may be
// discarded.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

func main() {
	keep := flag.Bool("keep", false, "keep the temporary module and print where it is")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./internal/doccheck [-keep] file.md...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Args(), *keep); err != nil {
		fmt.Fprintln(os.Stderr, "doccheck:", err)
		os.Exit(1)
	}
}

func run(files []string, keep bool) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	mods, err := modules(root)
	if err != nil {
		return err
	}

	// Read every block and say what it is before building any.
	var (
		blocks  []*block // those that parse
		all     int
		count   = map[kind]int{}
		failed  []string // the blocks that fail, by name
		reports []string // why, for those found before the build
	)
	fail := func(b *block, msg string) {
		reports = append(reports, msg)
		failed = append(failed, b.String())
	}
	var (
		jsonAll    int
		jsonKindsN = map[string]int{}
	)
	for _, name := range files {
		name = filepath.ToSlash(filepath.Clean(name))
		bs, err := extract(filepath.Join(root, filepath.FromSlash(name)), name)
		if err != nil {
			return err
		}
		js, err := extractJSON(filepath.Join(root, filepath.FromSlash(name)), name)
		if err != nil {
			return err
		}
		fileKinds := map[string]int{}
		for _, b := range js {
			if err := checkJSON(b); err != nil {
				reports = append(reports, err.Error())
				failed = append(failed, b.String())
			}
			fileKinds[b.kind]++
			jsonKindsN[b.kind]++
		}
		jsonAll += len(js)
		kinds := map[kind]int{}
		for _, b := range bs {
			if err := classify(b); err != nil {
				fail(b, err.Error())
			} else {
				blocks = append(blocks, b)
			}
			kinds[b.kind]++
			count[b.kind]++
		}
		all += len(bs)
		if name == "README.md" && len(bs) > 0 && (bs[0].kind != program || !isMain(bs[0].code)) {
			fail(bs[0], fmt.Sprintf("%v: the README's first Go block is a newcomer's first program: it must be a whole package main", bs[0]))
		}
		var what []string
		if len(bs) > 0 {
			what = append(what, fmt.Sprintf("%d Go %s: %s", len(bs), plural(len(bs), "block"), describe(kinds)))
		}
		if len(js) > 0 {
			what = append(what, fmt.Sprintf("%d JSON %s: %s", len(js), plural(len(js), "block"), describeJSON(fileKinds)))
		}
		if len(what) == 0 {
			fmt.Printf("%s: no Go or JSON block\n", name)
		} else {
			fmt.Printf("%s: %s\n", name, strings.Join(what, "; "))
		}
	}
	for _, r := range reports {
		fmt.Println(r)
	}

	tmp, err := os.MkdirTemp("", "doccheck")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("doccheck: the module is in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	byPkg := map[string]*block{}
	for _, b := range blocks {
		if b.kind == quote {
			if err := checkQuote(b, mods); err != nil {
				fmt.Println(err)
				failed = append(failed, b.String())
			}
			continue
		}
		dir := pkgDir(b)
		byPkg["doccheck/"+dir] = b
		if err := os.MkdirAll(filepath.Join(tmp, dir), 0o755); err != nil {
			return err
		}
		abs := filepath.Join(root, filepath.FromSlash(b.file))
		if err := os.WriteFile(filepath.Join(tmp, dir, "block.go"), []byte(source(b, abs)), 0o644); err != nil {
			return err
		}
	}
	if err := writeGoMod(tmp, mods); err != nil {
		return err
	}

	// tidy -e leaves an import that no module provides to go build, which
	// names its block and line. Each later step runs on the packages that
	// passed the one before, so that one run reports every failing block.
	if out, err := goCmd(tmp, "go", "mod", "tidy", "-e"); err != nil {
		fmt.Print(relative(out, root, tmp))
		return fmt.Errorf("go mod tidy: %v", err)
	}
	pkgs := make([]string, 0, len(byPkg))
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	staticcheck := "staticcheck"
	if len(pkgs) > 0 {
		if staticcheck, err = exec.LookPath("staticcheck"); err != nil {
			return fmt.Errorf("staticcheck is not on PATH: go install honnef.co/go/tools/cmd/staticcheck@v0.8.2, as .ci/run does")
		}
	}
	// U1000 would call unused what a block of declarations offers the reader.
	if err := os.WriteFile(filepath.Join(tmp, "staticcheck.conf"), []byte(`checks = ["inherit", "-U1000"]`+"\n"), 0o644); err != nil {
		return err
	}
	for _, step := range [][]string{
		{"go", "build", "-o", os.DevNull},
		{"go", "vet"},
		{staticcheck},
	} {
		if len(pkgs) == 0 {
			break
		}
		out, err := goCmd(tmp, append(step, pkgs...)...)
		if err == nil {
			continue
		}
		out = []byte(relative(markdownPositions(out, tmp), root, tmp))
		fmt.Print(string(out))
		bad := blame(out, byPkg)
		if len(bad) == 0 {
			return fmt.Errorf("%s: %v", strings.Join(step, " "), err)
		}
		var passed []string
		for _, p := range pkgs {
			if bad[p] {
				failed = append(failed, byPkg[p].String())
			} else {
				passed = append(passed, p)
			}
		}
		pkgs = passed
	}
	problems, err := checkBodies(tmp, root, byPkg, pkgs)
	if err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Println(p.msg)
		failed = append(failed, p.block.String())
	}

	if len(failed) > 0 {
		sort.Strings(failed)
		failed = dedup(failed)
		return fmt.Errorf("%d of the %d blocks (%d Go, %d JSON) fail:\n\t%s", len(failed), all+jsonAll, all, jsonAll, strings.Join(failed, "\n\t"))
	}
	built := describe(map[kind]int{program: count[program], declarations: count[declarations], fragment: count[fragment]})
	if built == "" {
		built = "none"
	}
	summary := fmt.Sprintf("doccheck: all %d Go blocks of %d files pass: %s built, vetted and staticchecked", all, len(files), built)
	if n := count[quote]; n > 0 {
		summary += fmt.Sprintf(", %s checked against the package's source", describe(map[kind]int{quote: n}))
	}
	summary += "; every response body is closed"
	if jsonAll > 0 {
		summary += fmt.Sprintf("; all %d JSON blocks pass: %s", jsonAll, describeJSON(jsonKindsN))
	}
	fmt.Println(summary)
	return nil
}

// describeJSON says how many JSON blocks of each kind kinds counts, and
// what was checked of them.
func describeJSON(kinds map[string]int) string {
	var parts []string
	if n := kinds[jsonConfig]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d %s loaded by LoadConfig", n, plural(n, "configuration")))
	}
	for _, k := range sortedKinds() {
		if n := kinds[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s %s checked against its type", n, k, plural(n, "report")))
		}
	}
	return strings.Join(parts, ", ")
}

func isMain(code string) bool {
	return regexp.MustCompile(`(?m)^package main\s*$`).MatchString(code)
}

// modules returns the checkout's modules, path to directory: the root's and
// those of its subdirectories with a go.mod of their own.
func modules(root string) (map[string]string, error) {
	mods := map[string]string{}
	dirs := []string{root}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(root, e.Name()))
		}
	}
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if os.IsNotExist(err) && dir != root {
			continue
		} else if err != nil {
			return nil, err
		}
		m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(data)
		if m == nil {
			return nil, fmt.Errorf("%s: no module line", filepath.Join(dir, "go.mod"))
		}
		mods[string(m[1])] = dir
	}
	return mods, nil
}

// writeGoMod writes the temporary module's go.mod: every module of the
// checkout required, and replaced by its directory.
func writeGoMod(dir string, mods map[string]string) error {
	paths := make([]string, 0, len(mods))
	for p := range mods {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var w strings.Builder
	w.WriteString("module doccheck\n\ngo 1.25\n\nrequire (\n")
	for _, p := range paths {
		fmt.Fprintf(&w, "\t%s v0.0.0\n", p)
	}
	w.WriteString(")\n\n")
	for _, p := range paths {
		fmt.Fprintf(&w, "replace %s => %s\n", p, mods[p])
	}
	return os.WriteFile(filepath.Join(dir, "go.mod"), []byte(w.String()), 0o644)
}

// goCmd runs the go command in dir, outside any workspace, and returns its
// combined output.
func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// relative writes the Markdown files' paths in the go command's output,
// absolute or relative to dir, where it ran (it prints the shorter),
// relative to the checkout, as the command line named them.
func relative(out []byte, root, dir string) string {
	text := strings.ReplaceAll(string(out), root+string(filepath.Separator), "")
	if rel, err := filepath.Rel(dir, root); err == nil {
		text = strings.ReplaceAll(text, rel+string(filepath.Separator), "")
	}
	return text
}

var goPosition = regexp.MustCompile(`(\S*block\.go):(\d+):(\d+)`)

// markdownPositions rewrites the positions in the generated files that a
// tool printed without heeding their //line comments (staticcheck does)
// as the Markdown positions those comments give.
func markdownPositions(out []byte, tmp string) []byte {
	return goPosition.ReplaceAllFunc(out, func(m []byte) []byte {
		sub := goPosition.FindSubmatch(m)
		path := string(sub[1])
		if !filepath.IsAbs(path) {
			path = filepath.Join(tmp, path)
		}
		line, _ := strconv.Atoi(string(sub[2]))
		col, _ := strconv.Atoi(string(sub[3]))
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return m
		}
		tf := fset.File(f.Pos())
		if line < 1 || line > tf.LineCount() {
			return m
		}
		start := tf.LineStart(line)
		if col > 1 && tf.Offset(start)+col-1 <= tf.Size() {
			start += token.Pos(col - 1)
		}
		p := fset.Position(start)
		return []byte(fmt.Sprintf("%s:%d:%d", p.Filename, p.Line, p.Column))
	})
}

var (
	pkgHeader = regexp.MustCompile(`(?m)^(?:# |go: )?(doccheck/\S+)`)
	position  = regexp.MustCompile(`(?m)^(?:vet: )?(\S+\.md):(\d+)`)
)

// blame returns the packages that the go command's output blames: by a
// package header, or by a position in a block's lines.
func blame(out []byte, byPkg map[string]*block) map[string]bool {
	text := string(out)
	bad := map[string]bool{}
	for _, m := range pkgHeader.FindAllStringSubmatch(text, -1) {
		if byPkg[m[1]] != nil {
			bad[m[1]] = true
		}
	}
	for _, m := range position.FindAllStringSubmatch(text, -1) {
		line, _ := strconv.Atoi(m[2])
		for p, b := range byPkg {
			from, last := b.fence, b.fence+strings.Count(b.code, "\n")+1
			if b.dir.line != 0 {
				from = b.dir.line
			}
			if b.file == m[1] && line >= from && line <= last {
				bad[p] = true
			}
		}
	}
	return bad
}

// describe says how many blocks of each kind kinds counts, or "".
func describe(kinds map[kind]int) string {
	var parts []string
	for _, k := range []kind{program, declarations, fragment, quote, 0} {
		n := kinds[k]
		switch {
		case n == 0:
		case k == 0:
			parts = append(parts, fmt.Sprintf("%d not Go", n))
		case k == declarations:
			parts = append(parts, fmt.Sprintf("%d of declarations", n))
		default:
			parts = append(parts, fmt.Sprintf("%d %s", n, plural(n, k.String())))
		}
	}
	return strings.Join(parts, ", ")
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
