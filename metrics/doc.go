// Package metrics is what preforkd counts and how it reports it: the
// families of the region's statistics rows (shm.Region.StatRow), the
// words each takes, and the Prometheus text of their sums.
//
// A worker counts into its own row ([NewRow], then [Row.Add],
// [Row.AddRule], [Row.Observe], [Row.Response]): atomic adds on memory no
// other worker writes, a few nanoseconds each, no allocation. The
// supervisor sums the rows ([Read]) and writes the page
// ([Snapshot.AppendFamilies], [Snapshot.AppendTable], and
// [Snapshot.AppendRedis] while Redis is configured); sums never go down,
// whatever workers come and go (see package shm). Labels are bounded: a
// rule name, a status code, a fixed list of results and kinds; never a
// client, a key or a pid.
//
// Adding a metric is one constant and one entry of the families table;
// [Geometry] sizes the region for it.
package metrics
