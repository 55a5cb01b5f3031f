package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeCommands reads README's "Command line" block: each entry, keyed
// by its command, is its lines (the first "preforkd NAME ..." and the
// indented ones after it); synopsis is their text before the comments.
func readmeCommands(t *testing.T) (entries, synopses map[string]string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Command line\n")
	if !ok {
		t.Fatal(`README has no "## Command line" section`)
	}
	_, block, ok := strings.Cut(section, "```\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal(`README's "Command line" section has no code block`)
	}
	entries, synopses = map[string]string{}, map[string]string{}
	name := ""
	for _, l := range strings.Split(block, "\n") {
		if rest, ok := strings.CutPrefix(l, "preforkd "); ok {
			name = strings.Fields(rest)[0]
			if _, dup := entries[name]; dup {
				t.Errorf("README's command line lists %s twice", name)
			}
		} else if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, " ") {
			t.Errorf("README's command line has a line that is no command's: %q", l)
			continue
		}
		if name == "" {
			continue
		}
		entries[name] += l + "\n"
		syn, _, _ := strings.Cut(l, "#")
		synopses[name] += syn + "\n"
	}
	return entries, synopses
}

// README's "Command line" lists every command of the binary, and no
// other; each command with every flag it takes, and no other; and each
// flag that has a default with that default ("-timeout 3s"), as
// "preforkd COMMAND -h" prints it.
func TestCommandLineDocumented(t *testing.T) {
	entries, synopses := readmeCommands(t)
	if len(entries) < 5 {
		t.Fatalf("read %d commands from README's command line: the scan misreads it", len(entries))
	}
	flagRef := regexp.MustCompile(`(?:^|[\s\[])-([a-z][a-z-]*)`)
	for _, c := range commands() {
		entry, ok := entries[c.name]
		if !ok {
			t.Errorf("README's command line does not list preforkd %s", c.name)
			continue
		}
		delete(entries, c.name)
		fs := commandFlags(c)
		c.setup(fs)
		for _, m := range flagRef.FindAllStringSubmatch(synopses[c.name], -1) {
			if fs.Lookup(m[1]) == nil {
				t.Errorf("README: preforkd %s -%s: the command has no such flag", c.name, m[1])
			}
		}
		for _, m := range flagRef.FindAllStringSubmatch(c.synopsis, -1) {
			if !regexp.MustCompile(`(?:^|[\s\[])-` + regexp.QuoteMeta(m[1]) + `\b`).MatchString(synopses[c.name]) {
				t.Errorf("README: preforkd %s does not show its flag -%s", c.name, m[1])
			}
		}
		n := 0
		fs.VisitAll(func(f *flag.Flag) {
			n++
			if !strings.Contains(c.synopsis, "-"+f.Name+" ") && !strings.Contains(c.synopsis, "-"+f.Name+"]") && !strings.HasSuffix(c.synopsis, "-"+f.Name) {
				t.Errorf("preforkd %s's usage line does not show its flag -%s", c.name, f.Name)
			}
			switch f.DefValue {
			case "", "0", "false":
				return // no default to state
			}
			if !strings.Contains(entry, "-"+f.Name+" "+f.DefValue) {
				t.Errorf("README: preforkd %s -%s defaults to %s, which its entry does not say (as \"-%s %s\"):\n%s", c.name, f.Name, f.DefValue, f.Name, f.DefValue, entry)
			}
		})
	}
	for name := range entries {
		t.Errorf("README's command line lists preforkd %s, which is no command", name)
	}
}
