# preforkd — see README.md. `make run` and `make test` do all the set-up;
# `make check` is the quick loop while developing.
GO ?= go
BIN := bin/preforkd
# Empty without git: the binary then reports what go build recorded in it.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# The one staticcheck that lint runs: go run fetches this version once,
# then takes it from the build cache.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run check test fuzz bench model conformance lint cross clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/preforkd

# make run ARGS="-workers 2 -log-format json": flags for preforkd run.
ARGS ?=
run: build
	./$(BIN) run -config examples/preforkd.toml $(ARGS)

# The quick loop (1m20s on 2 cores, build cache warm): lint, then the unit and
# multi-process tests in a random order, eight at a time (most of them
# wait on sockets and timers, not the CPU: one at a time per core, the
# default, took 2m03s). -short leaves out the end-to-end
# tests of separately built binaries; fuzzing and the model are make
# test's.
check: lint
	$(GO) test -count=1 -shuffle=on -short -parallel 8 -timeout 5m ./...
	$(GO) -C bench test -count=1 -shuffle=on -short -parallel 8 -timeout 5m ./...

# The whole proof: lint; unit, multi-process and end-to-end tests, in a
# random order; the race detector over every package (with -short: an
# end-to-end test drives a separately built binary, which it cannot see
# into); every benchmark once (so that none rots between two `make
# bench`); a short fuzz of every parser; the spin model; and the HTTP
# cache conformance suite. bench/ is a
# module of its own (see bench/README.md): its tests and benchmarks run
# from there, in one pass.
# The fuzz here is a smoke run (30000 inputs a target, about three minutes
# in all) that keeps CI within its budget; `make fuzz` runs a million.
# Tests run at the default, one per core: eight at a time (as check
# runs) halves the first pass, but the end-to-end tests' bounds on
# latency and on what a canary window serves are then met by luck on a
# busy machine.
test: lint
	$(GO) test -count=1 -shuffle=on -timeout 10m ./...
	$(GO) test -count=1 -shuffle=on -race -short -timeout 10m ./...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 5m ./...
	$(GO) -C bench test -count=1 -shuffle=on -bench . -benchtime 1x -timeout 10m ./...
	$(MAKE) fuzz FUZZTIME=30000x
	$(MAKE) model
	$(MAKE) conformance

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
# (bench/redis-http.sh), the cache (bench/cache-http.sh), TLS and HTTP/2
# (bench/tls-http.sh), each beside nginx where it applies.
bench:
	PKGS="./bench/ ./persist/ ./core/... ./proxy/ ./engine/loop/ ./metrics/ ./clientip/ ./route/ ./shm/ ./cmd/preforkd/" \
		AFTER="bench/http.sh bench/loop.sh bench/idle-conns.sh bench/redis-http.sh bench/cache-http.sh bench/tls-http.sh" bash bench/bench.sh

model:
	bash model/check.sh

# The response cache against the public HTTP cache test suite (a copy
# outside the repository: CACHE_TESTS=DIR, by default ../shared/cache-tests
# beside it), once per engine (the loop, fasthttp, net/http over TLS);
# fails when a required test fails or two engines differ on a test
# (bench/conformance.sh).
CACHE_TESTS ?= ../shared/cache-tests
conformance: build
	CACHE_TESTS="$(CACHE_TESTS)" BIN=$(BIN) bash bench/conformance.sh

# gofmt, go vet and staticcheck, over both modules.
lint: cross
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C bench vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) -C bench run $(STATICCHECK) ./...

# preforkd runs on Linux, but every package builds elsewhere (for
# development: what needs Linux returns shm.ErrNeedsLinux). A Linux-only
# call that slips into a shared file fails here; go vet type-checks the
# tests as well, for macOS, and the library packages for Windows.
CROSS ?= darwin/amd64 darwin/arm64 freebsd/amd64 windows/amd64
LIBS := ./config/... ./core/... ./bucket/... ./clientip/... ./route/... ./persist/... ./shm/... \
	./prefork/... ./engine/... ./metrics/... ./accesslog/... ./tlsconf/...
cross:
	@set -e; for p in $(CROSS); do echo "go build ./... for $$p"; \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build ./...; done
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	GOOS=windows GOARCH=amd64 $(GO) vet $(LIBS)

clean:
	rm -rf bin
