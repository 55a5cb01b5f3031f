package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster started by a test: masters with their
// replicas, each a Server on loopback ports of its own.
type Cluster struct {
	tb    testing.TB
	Nodes []*Server
}

// ClusterOptions shape a Cluster.
type ClusterOptions struct {
	Masters, Replicas int // replicas of each master
	// NodeTimeout is how long a node may miss pings before it is failing
	// (cluster-node-timeout).
	NodeTimeout time.Duration
	// Password is every node's (requirepass, and masterauth for the
	// replicas).
	Password string
}

// StartCluster starts o.Masters × (1 + o.Replicas) servers in cluster
// mode, joins them with redis-cli --cluster create, and waits until every
// node sees the whole Cluster served and every replica is in sync. A
// failing master's replica may take over whatever its replication lag
// (cluster-replica-validity-factor 0), and replicas sync at once
// (repl-diskless-sync-delay 0), so that a test never waits on data age.
func StartCluster(tb testing.TB, o ClusterOptions) *Cluster {
	tb.Helper()
	cli := need(tb, "redis-cli")
	c := &Cluster{tb: tb}
	args := []string{"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
		"--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0"}
	if o.Password != "" {
		args = append(args, "--masterauth", o.Password)
	}
	for range o.Masters * (1 + o.Replicas) {
		c.Nodes = append(c.Nodes, StartWith(tb, Options{Cluster: true, Password: o.Password, Args: args}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cliArgs := append([]string{"--cluster", "create"}, c.Seeds()...)
	cliArgs = append(cliArgs, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if o.Password != "" {
		cliArgs = append(cliArgs, "-a", o.Password, "--no-auth-warning")
	}
	create := exec.CommandContext(ctx, cli, cliArgs...)
	if out, err := create.CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !c.formed(len(c.Nodes)) {
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: the Cluster did not form within 30s:\n%s", c.describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// Seeds are the addresses of every node.
func (c *Cluster) Seeds() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr
	}
	return out
}

// formed reports whether every node knows n nodes and sees the Cluster
// ok, and every replica's link to its master is up.
func (c *Cluster) formed(n int) bool {
	for _, s := range c.Nodes {
		info := s.info("cluster")
		if info["cluster_state"] != "ok" || info["cluster_known_nodes"] != strconv.Itoa(n) {
			return false
		}
		if repl := s.info("replication"); repl["role"] == "slave" && repl["master_link_status"] != "up" {
			return false
		}
	}
	return true
}

// Masters are the live nodes that serve slots, as a live node sees them.
func (c *Cluster) Masters() []*Server {
	c.tb.Helper()
	var out []*Server
	for _, sl := range c.slots() {
		for _, s := range c.Nodes {
			if s.Addr == sl.Nodes[0].Addr && s.Alive() && !contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

func contains(ss []*Server, s *Server) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// OK reports whether a live node says cluster_state:ok and every slot is
// served by a live master: after a master was killed, that the Cluster
// has failed over.
func (c *Cluster) OK() bool {
	live := c.live()
	if live == nil || live.info("cluster")["cluster_state"] != "ok" {
		return false
	}
	served := 0
	for _, sl := range c.slots() {
		for _, s := range c.Nodes {
			if s.Addr == sl.Nodes[0].Addr {
				if !s.Alive() {
					return false
				}
				served += int(sl.End - sl.Start + 1)
			}
		}
	}
	return served == 16384
}

// slots is CLUSTER SLOTS as a live node answers it (nil if none does).
func (c *Cluster) slots() []redis.ClusterSlot {
	live := c.live()
	if live == nil {
		return nil
	}
	cl := live.client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	//lint:ignore SA1019 CLUSTER SLOTS is still served (Redis 7 deprecates it), and its ranges name their master first, which is all a test needs
	sl, _ := cl.ClusterSlots(ctx).Result()
	return sl
}

// live is a node that runs, or nil.
func (c *Cluster) live() *Server {
	for _, s := range c.Nodes {
		if s.Alive() {
			return s
		}
	}
	return nil
}

// describe is every node's view, for a failure's message.
func (c *Cluster) describe() string {
	var b strings.Builder
	for _, s := range c.Nodes {
		info := s.info("cluster")
		repl := s.info("replication")
		fmt.Fprintf(&b, "%s alive=%v state=%s known=%s role=%s link=%s\n", s.Addr, s.Alive(),
			info["cluster_state"], info["cluster_known_nodes"], repl["role"], repl["master_link_status"])
	}
	return b.String()
}
