package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type problem struct {
	block *block
	msg   string
}

// checkBodies type-checks each block's package against the export data of
// its imports, which go build has just made, and reports every
// *http.Response that a call returns and the block then discards or never
// closes the body of (resp.Body.Close(), deferred or not). pkgs are the
// blocks' packages that built.
func checkBodies(tmp, root string, byPkg map[string]*block, pkgs []string) ([]problem, error) {
	if len(pkgs) == 0 {
		return nil, nil
	}
	out, err := goCmd(tmp, append([]string{"go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("go list -export: %v\n%s", err, out)
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})

	var problems []problem
	for _, path := range pkgs {
		b := byPkg[path]
		file := filepath.Join(tmp, strings.TrimPrefix(path, "doccheck/"), "block.go")
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		info := &types.Info{
			Types: map[ast.Expr]types.TypeAndValue{},
			Defs:  map[*ast.Ident]types.Object{},
			Uses:  map[*ast.Ident]types.Object{},
		}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(path, fset, []*ast.File{f}, info); err != nil {
			return nil, fmt.Errorf("%v: type-checking its package: %v", b, err)
		}
		for _, msg := range unclosed(fset, f, info) {
			problems = append(problems, problem{b, strings.ReplaceAll(msg, root+string(filepath.Separator), "")})
		}
	}
	return problems, nil
}

func isResponse(t types.Type) bool {
	return t != nil && types.TypeString(t, nil) == "*net/http.Response"
}

// unclosed returns a message for each response in f that is discarded or
// whose body is never closed.
func unclosed(fset *token.FileSet, f *ast.File, info *types.Info) []string {
	var msgs []string
	held := map[types.Object]token.Pos{} // responses a call returned, where
	closed := map[types.Object]bool{}
	results := func(call *ast.CallExpr) []types.Type {
		switch t := info.Types[call].Type.(type) {
		case *types.Tuple:
			ts := make([]types.Type, t.Len())
			for i := range ts {
				ts[i] = t.At(i).Type()
			}
			return ts
		case nil:
			return nil
		default:
			return []types.Type{t}
		}
	}
	assign := func(lhs []ast.Expr, rhs []ast.Expr) {
		var types_ []types.Type
		if len(rhs) == 1 {
			if call, ok := ast.Unparen(rhs[0]).(*ast.CallExpr); ok {
				types_ = results(call)
			}
		} else {
			for _, e := range rhs {
				if call, ok := ast.Unparen(e).(*ast.CallExpr); ok && len(results(call)) == 1 {
					types_ = append(types_, results(call)[0])
				} else {
					types_ = append(types_, nil)
				}
			}
		}
		for i, e := range lhs {
			if i >= len(types_) || !isResponse(types_[i]) {
				continue
			}
			id, ok := e.(*ast.Ident)
			if !ok {
				continue // a field or an element: held elsewhere
			}
			if id.Name == "_" {
				msgs = append(msgs, fmt.Sprintf("%s: a response is discarded: its body is never closed", fset.Position(id.Pos())))
				continue
			}
			obj := info.Defs[id]
			if obj == nil {
				obj = info.Uses[id]
			}
			if _, ok := held[obj]; obj != nil && !ok {
				held[obj] = id.Pos()
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			assign(n.Lhs, n.Rhs)
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				lhs[i] = id
			}
			assign(lhs, n.Values)
		case *ast.ExprStmt:
			if call, ok := ast.Unparen(n.X).(*ast.CallExpr); ok {
				for _, t := range results(call) {
					if isResponse(t) {
						msgs = append(msgs, fmt.Sprintf("%s: a response is discarded: its body is never closed", fset.Position(call.Pos())))
					}
				}
			}
		case *ast.CallExpr:
			// resp.Body.Close()
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Close" {
				break
			}
			body, ok := sel.X.(*ast.SelectorExpr)
			if !ok || body.Sel.Name != "Body" {
				break
			}
			if id, ok := body.X.(*ast.Ident); ok && info.Uses[id] != nil {
				closed[info.Uses[id]] = true
			}
		}
		return true
	})
	for obj, pos := range held {
		if !closed[obj] {
			msgs = append(msgs, fmt.Sprintf("%s: %s's body is never closed (defer %s.Body.Close())", fset.Position(pos), obj.Name(), obj.Name()))
		}
	}
	sort.Strings(msgs)
	return msgs
}
