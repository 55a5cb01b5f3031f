package redisstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
)

// A Cluster whose nodes want a password: the Store reaches every master
// with the password from its seed URLs, or from Password, and decides
// exactly on keys spread over the masters.
func TestClusterAuth(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: 5 * time.Second, Password: "pw-of-cluster"})
	o := counting
	for _, a := range cl.Seeds() {
		o.Cluster = append(o.Cluster, "redis://:pw-of-cluster@"+a)
	}
	h := newHost(t, cl.Nodes[0], 0, o)
	for k := range 12 {
		exactly10key(t, h, "seed-urls", fmt.Sprint("k", k))
	}
	o.Cluster, o.Password = cl.Seeds()[:1], "pw-of-cluster"
	h = newHost(t, cl.Nodes[0], 0, o)
	for k := range 12 {
		exactly10key(t, h, "password", fmt.Sprint("k", k))
	}
	masters := map[string]bool{}
	for _, m := range cl.Masters() {
		if m.Calls("evalsha")+m.Calls("eval") > 0 {
			masters[m.Addr] = true
		}
	}
	if len(masters) != 3 {
		t.Errorf("decisions reached %d masters of 3", len(masters))
	}
}
