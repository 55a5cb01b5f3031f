// Package stability checks STABILITY.md against the code: every exported
// Go identifier it names exists in the package it names it for.
package stability

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestStabilityNamesExist fails naming each identifier that STABILITY.md
// names for a package that does not declare it: a promise about an API
// that is not there (renamed, moved, removed) misleads the reader.
func TestStabilityNamesExist(t *testing.T) {
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "STABILITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := loadPackages(t, root)
	refs := namedIdentifiers(string(text), pkgs)
	if len(refs) < 100 {
		t.Fatalf("only %d identifiers found in STABILITY.md: the scan misreads it", len(refs))
	}
	for _, r := range refs {
		if !pkgs[r.pkg].has(r.name) {
			t.Errorf("STABILITY.md line %d names %s.%s, which package %s does not declare", r.line, filepath.Base(r.pkg), r.name, r.pkg)
		}
	}
}

// TestStabilityScanCatches checks the check: a name STABILITY.md gives
// for a package, misspelt, is reported.
func TestStabilityScanCatches(t *testing.T) {
	root := repoRoot(t)
	pkgs := loadPackages(t, root)
	for _, c := range []struct{ text, want string }{
		{"- `prefork` (`Run` and `IsWorkerX`)", "prefork.IsWorkerX"},
		{"- `core` (`Core.LimiterX`)", "core.Core.LimiterX"},
		{"- `shm.CreateX` and `tlsconf` (`Rotate`)", "shm.CreateX"},
		{"- `engine` (`DefaultX…`)", "engine.DefaultX…"},
		{"- This version changed `prefork` (no `Handler`): `core.SharedLimiter.ResetX`", "core.SharedLimiter.ResetX"},
	} {
		var missing []string
		for _, r := range namedIdentifiers(c.text, pkgs) {
			if !pkgs[r.pkg].has(r.name) {
				missing = append(missing, filepath.Base(r.pkg)+"."+r.name)
			}
		}
		if len(missing) != 1 || missing[0] != c.want {
			t.Errorf("%q: missing %v, want [%s]", c.text, missing, c.want)
		}
	}
}

// ref is an identifier STABILITY.md names (Name, Type.Member, or a
// prefix ending in "…") for the package at path pkg.
type ref struct {
	pkg, name string
	line      int
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	mention    = regexp.MustCompile(`(^|\s)package\s*$`)
	goName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*…?$`)
)

// namedIdentifiers reads text bullet by bullet. A package named in
// backticks (`core`, `engine/nethttp`, `shm`'s) is the one the bullet
// speaks of from there on; an exported name in backticks belongs to it,
// and one qualified by a package (`route.Compile`) to that one, which it
// also makes current. A package named after the word "package" is only
// mentioned ("exported for package `persist`"). The bullet on what this
// version changed names what is gone too: only its qualified names
// (`core.SharedLimiter.Reset`) are taken from it.
func namedIdentifiers(text string, pkgs map[string]*pkgInfo) []ref {
	byName := map[string]string{}
	base := map[string]int{}
	for p := range pkgs {
		byName[p] = p
		base[filepath.Base(p)]++
	}
	for p := range pkgs {
		if b := filepath.Base(p); base[b] == 1 {
			byName[b] = p
		}
	}
	var refs []ref
	cur := ""
	skip := false
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			cur = ""
			skip = strings.HasPrefix(line, "- This version changed")
		}
		for _, m := range backticked.FindAllStringSubmatchIndex(line, -1) {
			tok := line[m[2]:m[3]]
			if p, ok := byName[tok]; ok {
				before := line[:m[0]]
				if strings.TrimSpace(before) == "" && i > 0 {
					before = lines[i-1] // the word may end the line above
				}
				if !mention.MatchString(before) && !skip {
					cur = p
				}
				continue
			}
			if !goName.MatchString(tok) {
				continue
			}
			parts := strings.SplitN(tok, ".", 2)
			if p, ok := byName[parts[0]]; ok && len(parts) == 2 {
				if !exported(parts[1]) {
					continue // a configuration key: `persist.key`
				}
				if !skip {
					cur = p
				}
				refs = append(refs, ref{p, parts[1], i + 1})
				continue
			}
			if cur != "" && exported(tok) {
				refs = append(refs, ref{cur, tok, i + 1})
			}
		}
	}
	return refs
}

func exported(name string) bool { return token.IsExported(name) }

// pkgInfo is what a package declares: its top-level names, and for each
// type the names of its fields and methods (an interface's too).
type pkgInfo struct {
	top     map[string]bool
	members map[string]map[string]bool // type → its fields and methods
	embeds  map[string][]string        // type → the types of the package it embeds
}

// has reports whether p declares name: a top-level name; Type.Member, a
// field or method of Type (or of a type Type embeds); a prefix ending in
// "…" of a top-level name; or a bare name that is a field or method of
// one of its types (`Handover`, named after `Options`).
func (p *pkgInfo) has(name string) bool {
	if p == nil {
		return false
	}
	if prefix, ok := strings.CutSuffix(name, "…"); ok {
		for n := range p.top {
			if strings.HasPrefix(n, prefix) && n != prefix {
				return true
			}
		}
		return false
	}
	if typ, member, ok := strings.Cut(name, "."); ok {
		return p.hasMember(typ, member, 0)
	}
	if p.top[name] {
		return true
	}
	for _, ms := range p.members {
		if ms[name] {
			return true
		}
	}
	return false
}

func (p *pkgInfo) hasMember(typ, member string, depth int) bool {
	if p.members[typ][member] {
		return true
	}
	for _, e := range p.embeds[typ] {
		if depth < 4 && p.hasMember(e, member, depth+1) {
			return true
		}
	}
	return false
}

// repoRoot is the directory of go.mod above this one.
func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

// loadPackages parses the declarations of every package of the module
// but its commands, examples and internal packages, keyed by its path
// relative to root ("engine/nethttp"), files of every build constraint
// together.
func loadPackages(t *testing.T, root string) map[string]*pkgInfo {
	pkgs := map[string]*pkgInfo{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel == ".":
				return nil
			case strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata",
				rel == "cmd", rel == "examples", rel == "internal", rel == "bench":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		key := filepath.ToSlash(filepath.Dir(rel))
		p := pkgs[key]
		if p == nil {
			p = &pkgInfo{top: map[string]bool{}, members: map[string]map[string]bool{}, embeds: map[string][]string{}}
			pkgs[key] = p
		}
		p.add(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func (p *pkgInfo) member(typ, name string) {
	if p.members[typ] == nil {
		p.members[typ] = map[string]bool{}
	}
	p.members[typ][name] = true
}

func (p *pkgInfo) add(f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.top[d.Name.Name] = true
				continue
			}
			if typ := recvType(d.Recv.List[0].Type); typ != "" {
				p.member(typ, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.top[n.Name] = true
					}
				case *ast.TypeSpec:
					p.top[s.Name.Name] = true
					p.addFields(s.Name.Name, s.Type)
				}
			}
		}
	}
}

func (p *pkgInfo) addFields(typ string, x ast.Expr) {
	var list *ast.FieldList
	switch x := x.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return
	}
	for _, f := range list.List {
		for _, n := range f.Names {
			p.member(typ, n.Name)
		}
		if len(f.Names) == 0 { // embedded
			if e := recvType(f.Type); e != "" {
				p.member(typ, e)
				p.embeds[typ] = append(p.embeds[typ], e)
			}
		}
	}
}

// recvType is the name of the type in a receiver or an embedded field:
// T, *T, T[P], or "" for another package's.
func recvType(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.IndexListExpr:
		return recvType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}
