# preforkd — see README.md. `make run` and `make test` do all the set-up.
GO ?= go
BIN := bin/preforkd
# Empty without git: the binary then reports what go build recorded in it.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: all build run test test-race fuzz bench model lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/preforkd

# make run ARGS="-workers 2 -log-format json": flags for preforkd run.
ARGS ?=
run: build
	./$(BIN) run -config examples/preforkd.toml $(ARGS)

# The race detector runs where goroutines share memory inside the test
# process; the daemon's end-to-end tests drive a separately built binary.
RACE_PKGS := ./internal/proctest/... ./shm/... ./bucket/... ./core/... ./metrics/... ./prefork/... \
	./clientip/... ./config/... ./route/... ./persist/... ./proxy/... ./engine/... ./redisstore/...

# The whole proof: vet, unit and multi-process tests, the race detector on
# the goroutine tests, every benchmark once (so that none rots between two
# `make bench`), a short fuzz of every parser, and the spin model.
# The fuzz here is a smoke run (30000 inputs a target, under two minutes
# in all) that keeps CI within its budget; `make fuzz` runs a million.
test: lint
	$(GO) test -count=1 -timeout 10m ./...
	$(GO) test -count=1 -race -timeout 10m $(RACE_PKGS)
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 5m ./...
	$(MAKE) fuzz FUZZTIME=30000x
	$(MAKE) model

# Budgets are counts of executions, not durations: with a duration, Go 1.26's
# fuzz coordinator can race its own deadline and fail a target with a bare
# "context deadline exceeded" and no input (golang/go#75804, fixed in 1.27).
FUZZTIME ?= 1000000x
fuzz:
	@set -e; for spec in $$($(GO) test -list '^Fuzz' ./... 2>/dev/null | awk '/^Fuzz/{f[n++]=$$1} /^ok/{for(i=0;i<n;i++) print $$2":"f[i]; n=0}'); do \
		pkg=$${spec%%:*}; fn=$${spec##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		out=$$($(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg 2>&1) || \
			{ echo "$$out"; echo "FAIL: fuzz $$pkg $$fn (the input is saved under testdata/fuzz)"; exit 1; }; \
	done

# Every benchmark side by side in one run, then wrk: the data plane
# (bench/http.sh), the event loop's targets in alternating pairs
# (bench/loop.sh), idle connections (bench/idle-conns.sh), Redis rules
# (bench/redis-http.sh), the cache (bench/cache-http.sh), each beside
# nginx where it applies.
bench:
	PKGS="./bench/ ./persist/ ./core/... ./proxy/ ./engine/loop/ ./metrics/ ./clientip/ ./route/ ./shm/ ./cmd/preforkd/" \
		AFTER="bench/http.sh bench/loop.sh bench/idle-conns.sh bench/redis-http.sh bench/cache-http.sh" bash bench/bench.sh

model:
	bash model/check.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
