package metrics

import (
	"math"
	"strconv"
	"strings"
)

// Text builds a page in the Prometheus text exposition format (version
// 0.0.4): each family's HELP and TYPE, then its samples.
type Text struct{ b []byte }

// ContentType is the page's media type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Family starts the family name of type typ ("counter", "gauge",
// "histogram").
func (t *Text) Family(name, typ, help string) {
	t.b = append(t.b, "# HELP "...)
	t.b = append(t.b, name...)
	t.b = append(t.b, ' ')
	t.b = appendEscaped(t.b, help, false)
	t.b = append(t.b, "\n# TYPE "...)
	t.b = append(t.b, name...)
	t.b = append(t.b, ' ')
	t.b = append(t.b, typ...)
	t.b = append(t.b, '\n')
}

// Uint writes one sample of name with the label pairs kv (name, value, …).
func (t *Text) Uint(name string, v uint64, kv ...string) {
	t.sample(name, kv)
	t.b = strconv.AppendUint(t.b, v, 10)
	t.b = append(t.b, '\n')
}

// Float writes one sample with a float value.
func (t *Text) Float(name string, v float64, kv ...string) {
	t.sample(name, kv)
	switch {
	case math.IsInf(v, 1):
		t.b = append(t.b, "+Inf"...)
	case math.IsInf(v, -1):
		t.b = append(t.b, "-Inf"...)
	case math.IsNaN(v):
		t.b = append(t.b, "NaN"...)
	default:
		t.b = strconv.AppendFloat(t.b, v, 'g', -1, 64)
	}
	t.b = append(t.b, '\n')
}

func (t *Text) sample(name string, kv []string) {
	t.b = append(t.b, name...)
	if len(kv) > 0 {
		t.b = append(t.b, '{')
		for i := 0; i+1 < len(kv); i += 2 {
			if i > 0 {
				t.b = append(t.b, ',')
			}
			t.b = append(t.b, kv[i]...)
			t.b = append(t.b, `="`...)
			t.b = appendEscaped(t.b, kv[i+1], true)
			t.b = append(t.b, '"')
		}
		t.b = append(t.b, '}')
	}
	t.b = append(t.b, ' ')
}

// Bytes is the page so far.
func (t *Text) Bytes() []byte { return t.b }

// Reset empties the page, keeping its buffer.
func (t *Text) Reset() { t.b = t.b[:0] }

// appendEscaped escapes a HELP text (\ and newline) or a label value (\,
// newline and ").
func appendEscaped(b []byte, s string, quote bool) []byte {
	if !strings.ContainsAny(s, "\\\n\"") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// Rule is a rule of the running configuration as the page names it, with
// the index it counts under (RuleIndex; -1: none yet, its counts are 0).
type Rule struct {
	Name  string
	Index int
}

// AppendFamilies writes every family of the schema from s: per-rule
// families for rules (every result of each, zeros included, so that
// a rule's series exist from the start), status codes that were sent at
// least once, histograms with their cumulative buckets.
func (s *Snapshot) AppendFamilies(t *Text, rules []Rule) {
	for f := range numFamilies {
		if !specs()[f].redis {
			s.appendFamily(t, f, rules)
		}
	}
}

// AppendRedis writes the families of a Redis store's calls: a page has
// them while [redis] is configured, as preforkd_redis_breaker_state.
func (s *Snapshot) AppendRedis(t *Text) {
	for f := range numFamilies {
		if specs()[f].redis {
			s.appendFamily(t, f, nil)
		}
	}
}

func (s *Snapshot) appendFamily(t *Text, f Family, rules []Rule) {
	sp := &specs()[f]
	switch {
	case sp.kind == perWorker:
		// Per process: AppendWorkers.
	case sp.perRule:
		t.Family(sp.name, "counter", helps[f].family)
		for _, r := range rules {
			if sp.label == "" {
				t.Uint(sp.name, s.RuleValue(f, r.Index, 0), "rule", r.Name)
			}
			for i, v := range sp.values {
				t.Uint(sp.name, s.RuleValue(f, r.Index, i), "rule", r.Name, sp.label, v)
			}
		}
	case sp.kind == connGauge:
		t.Family(sp.name, "gauge", helps[f].family)
		for i, v := range sp.values {
			t.Uint(sp.name, s.Conns(ConnReading+ConnState(i)), sp.label, v)
		}
	case sp.kind == histogram:
		appendHistogram(t, sp.name, helps[f].family, sp, func(b int) uint64 { return s.Value(f, b) }, s.Value(f, len(sp.bounds)+1))
	case sp.kind == codeHistogram:
		t.Family(sp.name, "counter", helps[f].family)
		off, nb := rowLayout.off[f], len(sp.bounds)+1
		for i, v := range sp.values {
			if n := s.Value(f, i); n > 0 { // 501 codes, most never sent
				t.Uint(sp.name, n, sp.label, v)
			}
		}
		appendHistogram(t, sp.hist, helps[f].hist, sp, func(b int) uint64 {
			var n uint64
			for i := range sp.values {
				n += s.word(off + i*nb + b)
			}
			return n
		}, s.word(off+len(sp.values)*nb))
	case sp.label == "":
		t.Family(sp.name, "counter", helps[f].family)
		t.Uint(sp.name, s.Value(f, 0))
	default:
		t.Family(sp.name, "counter", helps[f].family)
		for i, v := range sp.values {
			t.Uint(sp.name, s.Value(f, i), sp.label, v)
		}
	}
}

// Worker is a worker process as the page names it: its region worker
// index, and its own counts (ReadWorker).
type Worker struct {
	Index int
	Snap  *Snapshot
}

// AppendWorkers writes the families that a worker process counts for
// itself (its GC cycles), one sample per worker, labelled with its
// index.
func AppendWorkers(t *Text, workers []Worker) {
	for f := range numFamilies {
		sp := &specs()[f]
		if sp.kind != perWorker {
			continue
		}
		t.Family(sp.name, "counter", helps[f].family)
		for _, w := range workers {
			t.Uint(sp.name, w.Snap.Value(f, 0), "worker", strconv.Itoa(w.Index))
		}
	}
}

// appendHistogram writes a histogram from its bucket counts (not
// cumulative; the last is +Inf's) and its sum, in counted units.
func appendHistogram(t *Text, name, help string, sp *spec, count func(bucket int) uint64, sum uint64) {
	t.Family(name, "histogram", help)
	var cum uint64
	for i, b := range sp.bounds {
		cum += count(i)
		t.Uint(name+"_bucket", cum, "le", strconv.FormatFloat(float64(b)/sp.per, 'f', -1, 64))
	}
	cum += count(len(sp.bounds))
	t.Uint(name+"_bucket", cum, "le", "+Inf")
	t.Float(name+"_sum", float64(sum)/sp.per)
	t.Uint(name+"_count", cum)
}

// AppendTable writes the tables' occupancy and events.
func (s *Snapshot) AppendTable(t *Text) {
	tb := s.sum.Table
	gauge := func(name, help string, v int) {
		t.Family(name, "gauge", help)
		t.Uint(name, uint64(v))
	}
	counter := func(name, help string, v uint64) {
		t.Family(name, "counter", help)
		t.Uint(name, v)
	}
	// counter2 is a counter with one label of two values.
	counter2 := func(name, help, label, v1 string, n1 uint64, v2 string, n2 uint64) {
		t.Family(name, "counter", help)
		t.Uint(name, n1, label, v1)
		t.Uint(name, n2, label, v2)
	}
	gauge("preforkd_table_slots", "Counter slots in the shared table (table.counters).", tb.Slots)
	gauge("preforkd_table_slots_used", "Counter slots holding a key (counted as keys come and go; no scan).", tb.Live)
	counter("preforkd_table_claims_total", "Keys installed in free counter slots.", tb.Claims)
	counter("preforkd_table_reclaims_total", "Counter slots taken over from keys whose state was as fresh.", tb.Reclaims)
	counter2("preforkd_table_full_total", "Decisions answered by a rule's on_full: no slot in the probe window (no_slot), or its insert lock held too long (lock_timeout).",
		"reason", "no_slot", tb.Full, "lock_timeout", tb.LockTimeout)
	counter("preforkd_table_recovered_total", "Slots, records and insert locks released from dead workers.", tb.Recovered)
	counter("preforkd_table_loaded_total", "Counter slots filled from a dump or a migrated live region.", tb.Placed)
	gauge("preforkd_responses_records", "Stored-response records (table.responses).", tb.Records)
	gauge("preforkd_responses_records_used", "Records reserved or completed (expired ones until reused).", tb.RecordsInUse)
	counter("preforkd_responses_full_total", "Reservations refused: no record in the probe window (503).", tb.RecordsFull)
	gauge("preforkd_responses_blocks", "Blocks of the stored-response pool (table.response_bytes).", tb.Blocks)
	gauge("preforkd_responses_blocks_used", "Blocks holding a stored response.", tb.BlocksUsed)
	gauge("preforkd_responses_block_size_bytes", "Bytes of one block of the pool.", tb.BlockSize)
	counter("preforkd_responses_no_blocks_total", "Responses completed unreplayable for want of blocks.", tb.NoBlocks)
	counter("preforkd_cache_evictions_total", "Cached responses dropped before their expiry to make room.", tb.CacheEvicted)
	counter2("preforkd_cache_purges_total", "Purges of the response cache: by tag (POST /cache/purge?tag=), by URL (key=, and the invalidations of unsafe requests).",
		"by", "tag", tb.TagPurges, "url", tb.URLPurges)
}
