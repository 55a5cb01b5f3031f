package config

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Changes is what differs between two configurations, by the file's names,
// for the line a reload logs. It names keys, never their values: a value
// may be a secret (an upstream URL with a password, a persistence key).
type Changes struct {
	// Keys are the changed keys of the tables ("server.upstream") and of
	// the rules and blocks present in both ("ratelimit.login.limit",
	// "idempotency./orders.ttl"), in the order of the struct.
	Keys []string
	// Rules added, removed or changed, by name; blocks likewise, by path.
	RulesAdded, RulesRemoved, RulesChanged    []string
	BlocksAdded, BlocksRemoved, BlocksChanged []string
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool {
	return len(c.Keys) == 0 && len(c.RulesAdded) == 0 && len(c.RulesRemoved) == 0 &&
		len(c.BlocksAdded) == 0 && len(c.BlocksRemoved) == 0
}

// Diff compares two configurations key by key. Both should have their
// defaults filled in ([Config.WithDefaults]), so that a key left out and
// one set to its default are the same. Rules are matched by name and
// idempotency blocks by path: a rule whose position in the file moved is
// not changed.
func Diff(old, next Config) Changes {
	var ch Changes
	ov, nv := reflect.ValueOf(old), reflect.ValueOf(next)
	t := ov.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := keyName(f)
		if name == "" {
			continue
		}
		a, b := ov.Field(i), nv.Field(i)
		switch {
		case f.Type == reflect.TypeFor[[]RateLimit]():
			diffList(&ch, name, old.RateLimits, next.RateLimits, func(r RateLimit) string { return r.Name },
				&ch.RulesAdded, &ch.RulesRemoved, &ch.RulesChanged)
		case f.Type == reflect.TypeFor[[]Idempotency]():
			diffList(&ch, name, old.Idempotency, next.Idempotency, func(d Idempotency) string { return d.Path },
				&ch.BlocksAdded, &ch.BlocksRemoved, &ch.BlocksChanged)
		case f.Type.Kind() == reflect.Struct:
			ch.Keys = append(ch.Keys, diffFields(name, a, b)...)
		default:
			if !reflect.DeepEqual(a.Interface(), b.Interface()) {
				ch.Keys = append(ch.Keys, name)
			}
		}
	}
	return ch
}

// diffList matches the elements of two lists by id; an id seen twice in a
// list gets its position appended ("/orders#2") so that nothing is
// matched twice.
func diffList[T any](ch *Changes, section string, old, next []T, id func(T) string, added, removed, changed *[]string) {
	ids := func(l []T) ([]string, map[string]int) {
		out, at, seen := make([]string, len(l)), make(map[string]int, len(l)), map[string]int{}
		for i, e := range l {
			k := id(e)
			if seen[k]++; seen[k] > 1 {
				k += "#" + strconv.Itoa(seen[k])
			}
			out[i], at[k] = k, i
		}
		return out, at
	}
	oldIDs, oldAt := ids(old)
	newIDs, newAt := ids(next)
	for i, k := range newIDs {
		j, ok := oldAt[k]
		if !ok {
			*added = append(*added, k)
			continue
		}
		keys := diffFields(section+"."+k, reflect.ValueOf(old[j]), reflect.ValueOf(next[i]))
		if len(keys) > 0 {
			*changed = append(*changed, k)
			ch.Keys = append(ch.Keys, keys...)
		}
	}
	for _, k := range oldIDs {
		if _, ok := newAt[k]; !ok {
			*removed = append(*removed, k)
		}
	}
}

// diffFields lists the fields of two structs of one type that differ, as
// prefix.key.
func diffFields(prefix string, a, b reflect.Value) []string {
	var out []string
	t := a.Type()
	for i := range t.NumField() {
		name := keyName(t.Field(i))
		if name == "" {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) && !slices.Contains(out, prefix+"."+name) {
			out = append(out, prefix+"."+name)
		}
	}
	return out
}

// keyName is the file's name of a field (its toml tag); for a field that
// is not a key, the key of the file it is read from (its file tag: a
// rotated password is a change of redis.password_file), or "".
func keyName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if name == "-" {
		return f.Tag.Get("file")
	}
	return name
}
