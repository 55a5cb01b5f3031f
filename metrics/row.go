package metrics

import (
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// Row is where a process counts: its row of the region's statistics
// (shm.Region.StatRow). Every method is one or two atomic adds on memory
// no other worker writes; none allocates.
type Row struct {
	w     []uint64
	rules int // rule indexes the row has room for
	// gauges: the region drops the row's gauge words when its worker is
	// reaped (a region made with Geometry's StatGauges).
	gauges bool
}

// NewRow is the row of the process joined to r. A region made without
// room for the families (another geometry than Geometry's) gets a row of
// this process alone, which nobody reads.
func NewRow(r *shm.Region) Row {
	w := r.StatRow()
	if len(w) < rowLayout.fixedWords {
		w = make([]uint64, rowLayout.fixedWords)
	}
	return Row{w: w, rules: capacity(len(w)), gauges: r.Geometry().StatGauges == rowLayout.gaugeWords}
}

// Add adds n to value i of family f (a family that is not per rule).
func (r Row) Add(f Family, i int, n uint64) {
	atomic.AddUint64(&r.w[rowLayout.off[f]+i], n)
}

// AddRule adds n to value i of the per-rule family f for the rule index
// rule (RuleIndex); nothing for a rule without one (-1).
func (r Row) AddRule(f Family, rule, i int, n uint64) {
	if uint(rule) >= uint(r.rules) {
		return
	}
	atomic.AddUint64(&r.w[rowLayout.fixedWords+rule*rowLayout.perRuleWords+rowLayout.off[f]+i], n)
}

// SetGCCycles records that the process has run n garbage collections
// since it started, having recorded last before (0 the first time), for
// WorkerGCCycles: the row only ever grows.
func (r Row) SetGCCycles(last, n uint64) {
	if n > last {
		r.Add(WorkerGCCycles, 0, n-last)
	}
}

// Observe counts v, in the histogram f's counted unit (µs for durations,
// bytes for sizes).
func (r Row) Observe(f Family, v uint64) {
	bounds := histBounds[f]
	off := rowLayout.off[f]
	atomic.AddUint64(&r.w[off+bucket(bounds, v)], 1)
	atomic.AddUint64(&r.w[off+len(bounds)+1], v)
}

func bucket(bounds []uint64, v uint64) int {
	b := 0
	for b < len(bounds) && v > bounds[b] {
		b++
	}
	return b
}

// httpBuckets is the width of a status code's buckets in HTTPRequests.
var httpBuckets = len(histBounds[HTTPRequests]) + 1

// Response counts a response sent with status code after d: two adds,
// one for its code and duration bucket, one for the durations' sum.
func (r Row) Response(code int, d time.Duration) {
	i := code - minCode
	if code < minCode || code > maxCode {
		i = maxCode - minCode + 1 // "other"
	}
	us := uint64(max(d, 0) / time.Microsecond)
	off := rowLayout.off[HTTPRequests]
	atomic.AddUint64(&r.w[off+i*httpBuckets+bucket(histBounds[HTTPRequests], us)], 1)
	atomic.AddUint64(&r.w[off+numCodes*httpBuckets], us)
}

// Upstream counts the time d from sending a request to the upstream to its
// response head (or its failure), in UpstreamDuration: two adds.
func (r Row) Upstream(d time.Duration) {
	r.Observe(UpstreamDuration, uint64(max(d, 0)/time.Microsecond))
}

// RedisCall counts a round trip to Redis made for a request, with its
// result (RedisOK, RedisError, RedisTimeout) and how long it took: three
// adds.
func (r Row) RedisCall(result int, d time.Duration) {
	r.Add(RedisCalls, result, 1)
	r.Observe(RedisCallDuration, uint64(max(d, 0)/time.Microsecond))
}

// ConnState is a client connection's state as Connections counts it, as
// nginx's stub_status does.
type ConnState uint8

// The states of a client connection.
const (
	ConnClosed  ConnState = iota // not open: before its accept, after its close
	ConnReading                  // reading a request header, or waiting for the first one
	ConnWriting                  // a request in progress: its body, the decision, the upstream, the response; a tunnel
	ConnIdle                     // keep-alive, waiting for the next request
)

// connBits is the width of a state's count in the Connections word: the
// three counts share one word so that a change of state is one add. A
// count is exact below 2^21 (2,097,151) connections in one state over
// every worker.
const (
	connBits = 21
	connMask = 1<<connBits - 1
)

func connUnit(s ConnState) uint64 {
	if s == ConnClosed || s > ConnIdle {
		return 0
	}
	return 1 << (connBits * uint(s-1))
}

// Conns counts the client connections of an engine in a worker's row. The
// zero Conns counts nothing. Its methods are safe for concurrent use,
// allocate nothing, and are one atomic add each.
type Conns struct {
	states, accepted, maxReached *uint64
}

// Conns is where r's process counts its client connections. A region made
// without room for gauges that a reap drops (not by Geometry: an older
// build's) gets states of this process alone, which nobody reads: summed,
// a dead worker's connections would stay forever.
func (r Row) Conns() Conns {
	c := Conns{
		states:     &r.w[rowLayout.off[Connections]],
		accepted:   &r.w[rowLayout.off[ConnectionsAccepted]],
		maxReached: &r.w[rowLayout.off[ConnectionsMaxReached]],
	}
	if !r.gauges {
		c.states = new(uint64)
	}
	return c
}

// Move counts a connection going from one state to another: from
// ConnClosed when it is accepted, to ConnClosed when it closes. A
// connection must be counted in the state it leaves.
func (c Conns) Move(from, to ConnState) {
	if from != to && c.states != nil {
		atomic.AddUint64(c.states, connUnit(to)-connUnit(from))
	}
}

// Accepted counts a connection accepted (its state is counted by Move).
func (c Conns) Accepted() {
	if c.accepted != nil {
		atomic.AddUint64(c.accepted, 1)
	}
}

// MaxReached counts the worker reaching its bound of open connections
// (server.max_connections), where it stops accepting.
func (c Conns) MaxReached() {
	if c.maxReached != nil {
		atomic.AddUint64(c.maxReached, 1)
	}
}

// RuleIndex is the index the rule called name counts under in r, the same
// in every process for the region's life; -1 when the region's name table
// or rows have no room left (the rule is then not counted).
func RuleIndex(r *shm.Region, name string) int {
	i, ok := r.StatName(name, true)
	if !ok || i >= capacity(len(r.StatRow())) {
		return -1
	}
	return i
}

// RuleGate is the gate of the rule index rule's log lines of kind
// (GateRefused, GateShadow, GateFull, GateUnavailable): one line a second
// across workers.
func RuleGate(r *shm.Region, rule int, kind int) shm.Gate {
	if rule < 0 {
		return r.Gate(-1) // this process alone
	}
	return r.Gate(rule*gatesPerRule + kind)
}

// UpstreamGate is the gate of the log lines of an upstream error kind.
func UpstreamGate(r *shm.Region, kind int) shm.Gate {
	return r.Gate(r.Geometry().StatNames*gatesPerRule + kind)
}

// PeerGate is gate i (0..PeerGates-1) of the warning about forwarded
// requests from peers that are not trusted. A region made without them
// (by an older build, re-attached) gives gates of this process alone.
func PeerGate(r *shm.Region, i int) shm.Gate {
	if i < 0 || i >= PeerGates {
		return r.Gate(-1)
	}
	return r.Gate(r.Geometry().StatNames*gatesPerRule + upstreamGates + i)
}

// ResetGate is the gate of the lines about the application's reset
// header (a name of no rule, a reset Redis refused).
func ResetGate(r *shm.Region) shm.Gate {
	return r.Gate(r.Geometry().StatNames*gatesPerRule + upstreamGates + PeerGates)
}

// Kinds of a rule's log lines, for RuleGate.
const (
	GateRefused     = gateRefused     // enforced refusals
	GateShadow      = gateShadow      // shadow rules' would-be refusals
	GateFull        = gateFull        // requests let through by on_full open
	GateUnavailable = gateUnavailable // requests let through by on_unavailable open
)

// Snapshot is a sum of statistics rows, read by families.
type Snapshot struct {
	sum shm.StatSum
}

// Read sets s to the totals of every worker of r since the region was
// created (shm.Region.SumStats): they never go down.
func Read(r *shm.Region, s *Snapshot) { r.SumStats(&s.sum) }

// ReadWorker sets s to worker index w's counts since its process joined.
func ReadWorker(r *shm.Region, w int, s *Snapshot) { r.WorkerStats(w, &s.sum) }

// ReadOthers sets s to every count but worker index w's.
func ReadOthers(r *shm.Region, w int, s *Snapshot) { r.OthersStats(w, &s.sum) }

// Table is the tables' occupancy and events.
func (s *Snapshot) Table() shm.TableStats { return s.sum.Table }

// Consistent is shm.StatSum.Consistent.
func (s *Snapshot) Consistent() bool { return s.sum.Consistent }

// Conns is the number of connections open in state st (ConnReading,
// ConnWriting, ConnIdle) in the rows read.
func (s *Snapshot) Conns(st ConnState) uint64 {
	if st == ConnClosed || st > ConnIdle {
		return 0
	}
	return s.word(rowLayout.off[Connections]) >> (connBits * uint(st-1)) & connMask
}

// Value is value i of the family f (of a histogram, bucket i, the last
// but one +Inf, the last the sum); 0 when the rows have no such word.
func (s *Snapshot) Value(f Family, i int) uint64 {
	if f == HTTPRequests { // the one codeHistogram
		var n uint64
		for b := range httpBuckets {
			n += s.word(rowLayout.off[f] + i*httpBuckets + b)
		}
		return n
	}
	return s.word(rowLayout.off[f] + i)
}

func (s *Snapshot) word(j int) uint64 {
	if j < len(s.sum.Words) {
		return s.sum.Words[j]
	}
	return 0
}

// RuleValue is value i of the per-rule family f for the rule index rule.
func (s *Snapshot) RuleValue(f Family, rule, i int) uint64 {
	if rule < 0 {
		return 0
	}
	if j := rowLayout.fixedWords + rule*rowLayout.perRuleWords + rowLayout.off[f] + i; j < len(s.sum.Words) {
		return s.sum.Words[j]
	}
	return 0
}

// Requests is the number of responses counted, whatever their status.
func (s *Snapshot) Requests() uint64 {
	var n uint64
	for i := range numCodes {
		n += s.Value(HTTPRequests, i)
	}
	return n
}

// Errors5xx is the number of responses with a 5xx status.
func (s *Snapshot) Errors5xx() uint64 {
	var n uint64
	for c := 500; c <= maxCode; c++ {
		n += s.Value(HTTPRequests, c-minCode)
	}
	return n
}

// Total is value i of family f summed over every worker of r.
func Total(r *shm.Region, f Family, i int) uint64 { return r.StatTotal(rowLayout.off[f] + i) }

// RuleTotal is value i of the per-rule family f for the rule index rule,
// summed over every worker of r.
func RuleTotal(r *shm.Region, f Family, rule, i int) uint64 {
	if rule < 0 {
		return 0
	}
	return r.StatTotal(rowLayout.fixedWords + rule*rowLayout.perRuleWords + rowLayout.off[f] + i)
}
