package resilience

import (
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
// of this repository, and the name that follows, when there is one, must be
// declared or used in that file: files are merged and renamed, and a
// pointer nobody checks goes stale.
func TestCommentsNameFilesThatExist(t *testing.T) {
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
	pointer := regexp.MustCompile(`\(([a-z0-9_]+\.go)(?:, ([A-Za-z_][A-Za-z0-9_.]*))?\)`)
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
		}
		for _, m := range mention.FindAllStringSubmatch(text, -1) {
			checked++
			assert.NotEmpty(t, files[m[1]], "%s names %s, which is no file of this repository", src, m[1])
		}
		for _, m := range pointer.FindAllStringSubmatch(text, -1) {
			if m[2] == "" || len(files[m[1]]) == 0 {
				continue
			}
			name := m[2][strings.LastIndex(m[2], ".")+1:]
			declared := false
			for _, path := range files[m[1]] {
				body, err := os.ReadFile(path)
				require.NoError(t, err)
				declared = declared || regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).Match(body)
			}
			assert.True(t, declared, "%s points to %s in %s, which is not there", src, m[2], m[1])
		}
	}
	assert.Greater(t, checked, 20, "the pointers were found")
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
