package resilience

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A comment or a document that points to code by a file's name, as
// "(deadline.go)" or "(hoststate.go, newPolicies)", must name a file
// of this repository, and an identifier named with it, as newPolicies here
// or in "admission.go's pace", must be declared in that file: files are
// merged and renamed, code moves between them, and a pointer nobody checks
// goes stale.
func TestCommentsNameFilesThatExist(t *testing.T) {
	files := goFiles(t)
	mention := regexp.MustCompile(`(?:^|[\s(])([a-z0-9_]+\.go)\b`)
	var sources []string
	for _, dir := range []string{".", "internal/*", "server", "resiliencetest", "docs"} {
		for _, ext := range []string{"*.go", "*.md"} {
			found, err := filepath.Glob(filepath.Join(dir, ext))
			require.NoError(t, err)
			sources = append(sources, found...)
		}
	}
	checked := 0
	decls := declIndex{t: t, files: files, parsed: map[string]*fileDecls{}}
	for _, src := range sources {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		text := string(b)
		if strings.HasSuffix(src, ".go") {
			// A file's name alone after a line of code (a call, a field)
			// goes stale unseen when the callee moves: the name in the
			// code is the pointer.
			for i, line := range strings.Split(text, "\n") {
				assert.False(t, bareFilePointer.MatchString(line), "%s:%d: a line of code points to a file; its names are the pointer", src, i+1)
			}
			text = goComments(text)
		} else {
			text = strings.ReplaceAll(text, "`", "") // "`pace` in `admission.go`" is a pointer too
		}
		for _, m := range mention.FindAllStringSubmatch(text, -1) {
			checked++
			assert.NotEmpty(t, files[m[1]], "%s names %s, which is no file of this repository", src, m[1])
		}
		// An identifier named together with a file must be declared in
		// that file: "(hoststate.go, newPolicies)", "admission.go's pace",
		// "resolveRateLimit in ratelimitoptions.go", "the retry loop
		// (retry.go)" (namedPointer says what reads as an identifier).
		for _, p := range namedWithFile(text) {
			checked++
			if ok, declared := decls.declares(src, p); !ok {
				assert.Fail(t, "a comment names an identifier in the wrong file",
					"%s: %q names %s in %s, which declares no such name (declared in %s)", src, p.quote, p.ident, p.file, declared)
			}
		}
	}
	assert.Greater(t, checked, 20, "the pointers were found")
}

// The check of an identifier named with a file fails on the pointers that
// went stale (issue 47) and passes on prose that only looks like one.
func TestCommentPointersNameTheirDeclarations(t *testing.T) {
	decls := declIndex{t: t, files: goFiles(t), parsed: map[string]*fileDecls{}}
	for text, right := range map[string]bool{
		"The retry loop (standard.go) and":                     false,
		"The retry loop (retry.go) and":                        true,
		"(resolveRateLimit in admission.go, and so on)":        false,
		"(resolveRateLimit in ratelimitoptions.go, and so on)": true,
		"through admission.go's pace":                          true,
		"through retry.go's pace":                              false,
		"(hoststate.go, newPolicies)":                          true,
		"(admission.go, newPolicies)":                          false,
		"the slot is attempt.go's takeSlot()":                  false,
		"One call is one *call (call.go)":                      true,
		"One call is one *call (deadline.go)":                  false,
		"the struct's field (retryafter.go, retryLoop.budget)": false,
		"a field (call.go, call.quotaTaken)":                   true,
		// prose, and names beside a file that are no pointer to code in it
		"reused from call to call (deadline.go)":              true,
		"What a call tells its caller is in event.go":         true,
		"callers that left (fallback.go)":                     true,
		"the tables (overload_test.go, fleet_report_test.go)": true,
	} {
		found := namedWithFile(text)
		ok := true
		for _, p := range found {
			declared, _ := decls.declares("standard.go", p)
			ok = ok && declared
		}
		assert.Equal(t, right, ok, "%q: %+v", text, found)
	}
}

// goFiles are the Go files of the repository by base name.
func goFiles(t *testing.T) map[string][]string {
	files := map[string][]string{} // base name -> paths
	require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "results" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			files[d.Name()] = append(files[d.Name()], path)
		}
		return nil
	}))
	return files
}

// bareFilePointer is a line of code whose comment is only a file's name.
var bareFilePointer = regexp.MustCompile(`^\s*[^/\s].*//\s*\(?[a-z0-9_]+\.go\)?\s*$`)

// goComments is the text of src's comments, one per line; a string's
// content (a test's file names) is not a comment.
func goComments(src string) string {
	var out strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if i := strings.Index(line, "//"); i >= 0 && !strings.Contains(line[:i], `"`) && !strings.Contains(line[:i], "`") {
			out.WriteString(line[i+2:])
			out.WriteByte('\n')
		}
	}
	return out.String()
}

// A namedPointer is an identifier named together with a file's name.
type namedPointer struct {
	quote string // the words as written
	file  string // the file's base name
	ident string // the identifier: a name, a dotted name or words joined as one
	// strong is whether the words say the identifier is code even when it
	// reads as a plain word: "(hoststate.go, newPolicies)", "admission.go's
	// pace". Elsewhere ("through pace (admission.go)", "is in event.go",
	// "reused from call to call (deadline.go)") a plain word is prose and
	// only what reads as code is checked: a star, a dot, parentheses, a
	// capital or a digit inside, or plain words that join into a declared
	// name ("the retry loop" is retryLoop).
	strong bool
	words  int // how many words were joined into ident
}

var (
	// "(hoststate.go, newPolicies)"
	fileThenName = regexp.MustCompile(`\(([a-z0-9_]+\.go), (` + identPattern + `)\)`)
	// "standard.go's roundTrip"
	fileOwnsName = regexp.MustCompile(`\b([a-z0-9_]+\.go)'s\s+(` + identPattern + `)`)
	// "resolveRateLimit in ratelimitoptions.go"
	nameInFile = regexp.MustCompile(`(?:^|[\s(])(` + identPattern + `)\s+in\s+([a-z0-9_]+\.go)\b`)
	// "through pace (admission.go)", "the retry loop (retry.go; ...)"
	fileAfterWords = regexp.MustCompile(`\s\(([a-z0-9_]+\.go)[),;]`)
	identOnly      = regexp.MustCompile(`^` + identPattern + `$`)
	plainWord      = regexp.MustCompile(`^[A-Za-z][a-z]*$`)
)

const identPattern = `\*?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?`

// namedWithFile finds in text the identifiers named with a file.
func namedWithFile(text string) []namedPointer {
	var found []namedPointer
	for _, m := range fileThenName.FindAllStringSubmatch(text, -1) {
		if strings.HasSuffix(m[2], ".go") {
			continue // two files: "(overload_test.go, overload_upstream_test.go)"
		}
		found = append(found, namedPointer{quote: m[0], file: m[1], ident: m[2], strong: true, words: 1})
	}
	for _, m := range fileOwnsName.FindAllStringSubmatch(text, -1) {
		found = append(found, namedPointer{quote: m[0], file: m[1], ident: m[2], strong: true, words: 1})
	}
	for _, m := range nameInFile.FindAllStringSubmatch(text, -1) {
		found = append(found, namedPointer{quote: strings.TrimLeft(m[0], " \t\n("), file: m[2], ident: m[1], words: 1})
	}
	for _, loc := range fileAfterWords.FindAllStringSubmatchIndex(text, -1) {
		file := text[loc[2]:loc[3]]
		words := strings.Fields(text[max(0, loc[0]-80):loc[0]])
		// The last word alone, then the last two and three joined in camel
		// case when they are plain words: "the retry loop" is retryLoop.
		for n := 1; n <= 3 && n <= len(words); n++ {
			w := words[len(words)-n:]
			if n == 1 {
				if !identOnly.MatchString(w[0]) {
					break
				}
				found = append(found, namedPointer{quote: w[0] + " (" + file + ")", file: file, ident: w[0], words: 1})
				continue
			}
			joined := ""
			for i, s := range w {
				if !plainWord.MatchString(s) {
					joined = ""
					break
				}
				if i == 0 {
					joined = strings.ToLower(s)
				} else {
					joined += strings.ToUpper(s[:1]) + s[1:]
				}
			}
			if joined == "" {
				break
			}
			found = append(found, namedPointer{quote: strings.Join(w, " ") + " (" + file + ")", file: file, ident: joined, words: n})
		}
	}
	return found
}

// fileDecls is what a Go file declares: top-level names (functions,
// methods, types, variables, constants) and members (struct fields and
// interface methods).
type fileDecls struct {
	names, members map[string]bool
}

// declIndex parses the files a pointer names, once each.
type declIndex struct {
	t      *testing.T
	files  map[string][]string   // base name -> paths
	parsed map[string]*fileDecls // path -> its declarations
}

func (d *declIndex) of(path string) *fileDecls {
	if fd, ok := d.parsed[path]; ok {
		return fd
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	require.NoError(d.t, err)
	fd := &fileDecls{names: map[string]bool{}, members: map[string]bool{}}
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			fd.names[decl.Name.Name] = true
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					fd.names[spec.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						fd.names[n.Name] = true
					}
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		var fields *ast.FieldList
		switch n := n.(type) {
		case *ast.StructType:
			fields = n.Fields
		case *ast.InterfaceType:
			fields = n.Methods
		}
		if fields == nil {
			return true
		}
		for _, field := range fields.List {
			for _, name := range field.Names {
				fd.members[name.Name] = true
			}
		}
		return true
	})
	d.parsed[path] = fd
	return fd
}

// paths are the files a pointer in src to a file called base means: the
// one beside src, else the one at the root (a document speaks of the root
// package), else every file of that name.
func (d *declIndex) paths(src, base string) []string {
	all := d.files[base]
	for _, dir := range []string{filepath.Dir(src), "."} {
		for _, p := range all {
			if filepath.Dir(p) == dir {
				return []string{p}
			}
		}
	}
	return all
}

// declares says whether p's file declares p's identifier (or p is prose),
// and if not, which files of its package do.
func (d *declIndex) declares(src string, p namedPointer) (bool, []string) {
	paths := d.paths(src, p.file)
	if len(paths) == 0 {
		return true, nil // the file's existence is checked on its own
	}
	name := strings.TrimSuffix(strings.TrimPrefix(p.ident, "*"), "()")
	code := name != p.ident || strings.Contains(name, ".") || strings.ContainsAny(name[1:], "ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789")
	name = name[strings.LastIndex(name, ".")+1:]
	for _, path := range paths {
		if fd := d.of(path); fd.names[name] || fd.members[name] {
			return true, nil
		}
	}
	// Not there: whether the words are code at all, and where the name is.
	// Only the package's own files are read, and of its tests only the one
	// named: parsing every test file costs more than all the rest.
	var where []string
	known := false
	for _, path := range paths {
		pkg, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*.go"))
		require.NoError(d.t, err)
		for _, other := range pkg {
			if strings.HasSuffix(other, "_test.go") && other != path {
				continue
			}
			fd := d.of(other)
			if fd.names[name] || fd.members[name] {
				where = append(where, other)
			}
			known = known || fd.names[name]
		}
	}
	switch {
	case p.words > 1 && !known: // words, not a name
		return true, nil
	case p.words == 1 && !code && !(p.strong && len(where) > 0): // a word of prose
		return true, nil
	}
	return false, where
}
