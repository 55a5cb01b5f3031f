package main

import (
	"bufio"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// README's table of metrics names every family the /metrics page can
// write, with its labels, and no other; each value of a label with few
// values is named in the family's meaning. The page is written whole: a
// rule, [redis], a response table, a canary and a worker process.
func TestMetricsTableMatchesThePage(t *testing.T) {
	cfg := config.Default()
	cfg.Redis.URL = "redis://127.0.0.1:6379/0"
	cfg.RateLimits = []config.RateLimit{{Name: "login", Path: "/login", Limit: 5, Window: time.Minute}}
	cfg.Caches = []config.Cache{{Path: "/c/*"}}
	cfg = cfg.WithDefaults()
	o := cfg.RegionOptions()
	o.MaxWorkers = 2
	r, err := shm.Create(o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// A response, for the label of the families that write only the
	// codes sent.
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	metrics.NewRow(r).Response(200, time.Millisecond)
	// A child of this process, for the per-worker families' label.
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skipf("no child process to stand for a worker: %v", err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()

	a := &admin{region: r, started: time.Now()}
	a.status.Store(&prefork.Status{
		Settings: prefork.Settings{Config: cfg},
		Workers:  []prefork.WorkerStatus{{PID: child.Process.Pid, Index: 0, Ready: true}},
		Canary:   &prefork.CanaryStatus{Generation: 1, Verdict: prefork.VerdictHealthy},
	})
	w := httptest.NewRecorder()
	a.serveMetrics(w, httptest.NewRequest("GET", "/metrics", nil))

	// The page: family → label → values.
	page := map[string]map[string][]string{}
	kinds := map[string]string{}
	sample := regexp.MustCompile(`^([a-z_0-9]+)(?:\{(.*)\})? `)
	pair := regexp.MustCompile(`([a-z_]+)="((?:[^"\\]|\\.)*)"`)
	sc := bufio.NewScanner(strings.NewReader(w.Body.String()))
	for sc.Scan() {
		l := sc.Text()
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, kind, _ := strings.Cut(f, " ")
			kinds[name] = kind
			page[name] = map[string][]string{}
			continue
		}
		m := sample.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		name := m[1]
		if kinds[name] == "" {
			for _, sfx := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, sfx); ok && kinds[base] == "histogram" {
					name = base
				}
			}
		}
		labels, ok := page[name]
		if !ok {
			t.Errorf("the page has a sample of %s before its TYPE", m[1])
			continue
		}
		for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
			if p[1] != "le" && !slices.Contains(labels[p[1]], p[2]) {
				labels[p[1]] = append(labels[p[1]], p[2])
			}
		}
	}
	if len(page) < 60 {
		t.Fatalf("the page has %d families; want them all:\n%s", len(page), w.Body.String())
	}

	// README: | `name`, `name` | `label`, `label` | meaning |
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	documented := map[string]bool{}
	for l := range strings.SplitSeq(string(readme), "\n") {
		if !strings.HasPrefix(l, "| `preforkd_") {
			continue
		}
		// The cells, split at the bars that are not escaped (\|).
		cells := strings.Split(strings.ReplaceAll(strings.Trim(l, "| "), `\|`, "\x00"), "|")
		for i := range cells {
			cells[i] = strings.ReplaceAll(strings.TrimSpace(cells[i]), "\x00", `\|`)
		}
		if len(cells) < 3 {
			t.Errorf("README's metrics row has no meaning: %s", l)
			continue
		}
		var labels []string
		for _, q := range quoted.FindAllStringSubmatch(cells[1], -1) {
			labels = append(labels, q[1])
		}
		meaning := strings.Join(cells[2:], "|")
		for _, q := range quoted.FindAllStringSubmatch(cells[0], -1) {
			name := q[1]
			documented[name] = true
			got, ok := page[name]
			if !ok {
				t.Errorf("README's metrics table has %s, which the page does not write", name)
				continue
			}
			var onPage []string
			for k := range got {
				onPage = append(onPage, k)
			}
			slices.Sort(onPage)
			want := slices.Sorted(slices.Values(labels))
			if !slices.Equal(onPage, want) {
				t.Errorf("%s: README gives the labels %q, the page %q", name, want, onPage)
			}
			for k, vs := range got {
				switch k {
				case "rule", "worker", "code", "version", "commit": // a name, a number, a build
					continue
				}
				for _, v := range vs {
					if !strings.Contains(meaning, "`"+v+"`") {
						t.Errorf("%s: README does not say what %s=%q counts", name, k, v)
					}
				}
			}
		}
	}
	for name := range page {
		if !documented[name] {
			t.Errorf("the page writes %s (%s), which README's metrics table lacks", name, kinds[name])
		}
	}
}
