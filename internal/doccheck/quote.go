package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// checkQuote checks that every declaration of a quote block is the one of
// that name in its package's source, comments aside: a quote is the
// package's own text, which builds with the package, so it must not drift
// from it. The package is one of the checkout's: its import path under
// one of mods, the checkout's modules by path, gives its directory.
func checkQuote(b *block, mods map[string]string) error {
	dir := ""
	best := ""
	for path, d := range mods {
		if (b.dir.quotes == path || strings.HasPrefix(b.dir.quotes, path+"/")) && len(path) > len(best) {
			best = path
			dir = filepath.Join(d, strings.TrimPrefix(b.dir.quotes, path))
		}
	}
	if dir == "" {
		return fmt.Errorf("%v: quotes %s, which is not a package of this checkout", b, b.dir.quotes)
	}
	fset := token.NewFileSet()
	pkgDecls := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%v: quotes %s: %v", b, b.dir.quotes, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("%v: quotes %s: %v", b, b.dir.quotes, err)
		}
		for _, d := range f.Decls {
			for name, text := range declTexts(fset, d) {
				pkgDecls[name] = text
			}
		}
	}
	f, err := parser.ParseFile(fset, "", "package p\n"+b.code, parser.SkipObjectResolution)
	if err != nil {
		return b.parseError(err, 1)
	}
	for _, d := range f.Decls {
		for name, text := range declTexts(fset, d) {
			want, ok := pkgDecls[name]
			switch {
			case !ok:
				return fmt.Errorf("%s:%d: %v quotes %s, which declares no %s", b.file, b.firstLine()+fset.Position(d.Pos()).Line-2, b, b.dir.quotes, name)
			case strings.Join(strings.Fields(want), " ") != strings.Join(strings.Fields(text), " "):
				return fmt.Errorf("%s:%d: %v quotes %s.%s, but the source now reads:\n%s", b.file, b.firstLine()+fset.Position(d.Pos()).Line-2, b, b.dir.quotes, name, want)
			}
		}
	}
	return nil
}

// declTexts returns each name a top-level declaration declares, with the
// declaration of that name printed without its comments. The caller
// compares them with their runs of white space as one space, since a
// comment's place in the source shows as a blank line or a change of
// alignment in the printed text.
func declTexts(fset *token.FileSet, d ast.Decl) map[string]string {
	out := map[string]string{}
	print := func(name string, node any) {
		var buf bytes.Buffer
		if err := printer.Fprint(&buf, fset, node); err == nil {
			out[name] = buf.String()
		}
	}
	switch d := d.(type) {
	case *ast.FuncDecl:
		key := d.Name.Name
		if d.Recv != nil && len(d.Recv.List) == 1 {
			key = recvName(d.Recv.List[0].Type) + "." + key
		}
		stripped := *d
		stripped.Doc = nil
		print(key, &stripped)
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				print(s.Name.Name, &ast.GenDecl{Tok: d.Tok, Specs: []ast.Spec{stripSpec(s)}})
			case *ast.ValueSpec:
				for _, n := range s.Names {
					print(n.Name, &ast.GenDecl{Tok: d.Tok, Specs: []ast.Spec{stripSpec(s)}})
				}
			}
		}
	}
	return out
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}

// stripSpec returns a copy of spec without its doc and line comments,
// those of its fields and methods included; printer.Fprint of a node that
// is not a file prints no other comments.
func stripSpec(spec ast.Spec) ast.Spec {
	switch s := spec.(type) {
	case *ast.TypeSpec:
		c := *s
		c.Doc, c.Comment = nil, nil
		c.Type = stripType(c.Type)
		return &c
	case *ast.ValueSpec:
		c := *s
		c.Doc, c.Comment = nil, nil
		return &c
	}
	return spec
}

func stripType(e ast.Expr) ast.Expr {
	strip := func(fl *ast.FieldList) *ast.FieldList {
		if fl == nil {
			return nil
		}
		c := *fl
		c.List = nil
		for _, f := range fl.List {
			g := *f
			g.Doc, g.Comment = nil, nil
			c.List = append(c.List, &g)
		}
		return &c
	}
	switch t := e.(type) {
	case *ast.StructType:
		c := *t
		c.Fields = strip(t.Fields)
		return &c
	case *ast.InterfaceType:
		c := *t
		c.Methods = strip(t.Methods)
		return &c
	}
	return e
}
