# One entry point for developer and operator tasks (STYLE practice 11).
#   make demo     set up everything, then run a demo agent through the real pipeline
#   make test     set up everything, then lint and run every test (real PostgreSQL)
#   make release  build the release binaries (as your user; installs the build set)
#   make install  copy what `make release` built and the systemd unit (as root;
#                 no apt, no compiling)
#   make runtime-deps  the Debian packages choird needs at run time, no more

CARGO   ?= cargo
PREFIX  ?= /usr/local
DESTDIR ?=
UNITDIR ?= /etc/systemd/system
MANDIR  ?= $(PREFIX)/share/man/man1
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d

.PHONY: all deps build-deps runtime-deps base-image base-image-python build release code-order index-trial demo test lint fmt bench bench-memory bench-peers install uninstall clean

all: build

# System packages in three sets (scripts/install-deps.sh says what each
# holds): runtime < build (+ pgvector from source, the Rust check) < test (+
# the mail servers the tests run). Idempotent; none starts a listener.
deps:
	./scripts/install-deps.sh test
build-deps:
	./scripts/install-deps.sh build
runtime-deps:
	./scripts/install-deps.sh runtime

# The agents' Debian 12 base image, made from Debian packages and imported
# through the engine API (no registry). Rebuilt only when its script changes.
base-image: build-deps
	./scripts/build-base-image.sh

# The same with Debian's python3, for MCP servers in Python run inside agent
# containers (the tests run the reference servers from PyPI in it).
base-image-python: build-deps
	./scripts/build-base-image.sh python

build: deps
	$(CARGO) build --workspace --bins

# choir-agent is built on its own, so cargo's feature unification does not
# hand it choird's TLS and gzip (see `ureq` in Cargo.toml): a smaller binary
# in every agent container.
release: build-deps
	$(CARGO) build --workspace --release --bins --exclude choir-agent
	$(CARGO) build --release -p choir-agent

# Rewrites code-order/*.order (the function order release builds link with,
# so the code steady turns run lies together: fewer pages resident) from a
# profile of bench-soak under valgrind's callgrind. Minutes; run it again
# after dependency or toolchain updates.
code-order: deps
	./scripts/code-order.sh

# A developer's trial of pgvector's index kinds at a million items
# (docs/memory.md): its own scratch cluster, minutes. ARGS are
# the script's (--index hnsw|hnsw-bq|ivfflat --data clustered|uniform --n N).
PY_TRIAL = target/py-trial
index-trial: deps
	test -x $(PY_TRIAL)/bin/pip || python3 -m venv --clear $(PY_TRIAL)
	$(PY_TRIAL)/bin/pip install --quiet numpy==2.4.6 'psycopg[binary]==3.3.9'
	$(PY_TRIAL)/bin/python scripts/vector-index-trial.py $(ARGS)

demo: build base-image
	./scripts/demo.sh

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Services are required here: a test that cannot reach PostgreSQL fails
# instead of skipping (plain `cargo test` skips and says why).
# --all-targets: the test build of choir-agent carries its crash-injection
# failpoints (a dev-dependency feature); release builds never do.
test: deps base-image base-image-python lint
	$(CARGO) build --workspace --all-targets
	CHOIR_TEST_REQUIRE_SERVICES=1 $(CARGO) test --workspace --no-fail-fast

# Benchmarks: numbers are recorded in DESIGN.md (never asserted in tests).
# Each benchmark also adds its result lines to $(BENCH_TABLE); the last step
# prints them as one table.
BENCH_TABLE = target/bench-table.tsv
bench: export CHOIR_BENCH_TABLE = $(abspath $(BENCH_TABLE))
# The arbiter's criterion bench builds in its own target directory: built
# in target/, `cargo bench` relinks target/release/choir-agent with the
# dev-dependency features (failpoints) and without the release build's
# function order, and every later benchmark would run that agent.
bench: deps base-image release
	$(CARGO) bench -p choir-agent --bench arbiter --target-dir target/criterion
	$(CARGO) bench -p choir-agent --bench stream --target-dir target/criterion
	rm -f $(BENCH_TABLE)
	target/release/bench-docker
	target/release/bench-turns
	target/release/bench-telegram
	target/release/bench-replication
	target/release/bench-hostile
	target/release/bench-web
	target/release/bench-limbs
	target/release/bench-mcp
	target/release/bench-console
	target/release/bench-footprint
	target/release/bench-start
	target/release/bench-many
	target/release/bench-schedule
	target/release/bench-soak
	CHOIR_BENCH_N=50000 CHOIR_BENCH_DATA=clustered CHOIR_BENCH_UPSERTS=2000 target/release/bench-memory
	./scripts/bench-table.sh $(BENCH_TABLE)

# Choir beside nanobot and ZeroClaw (pinned; installed into target/peers by
# scripts/install-peers.sh, nothing system-wide), one fake model, one
# interleaved run at 1, 5 and 10 agents: docs/benchmarks.md, "Beside the
# peers". Not part of `make bench`: the first ZeroClaw build is long.
bench-peers: deps release
	./scripts/install-peers.sh target/peers
	target/release/bench-peers

# The memory store at scale (1,000,000 vectors; about 12 minutes); `make
# bench` runs it short (50,000 vectors, 2,000 upserts).
bench-memory: deps
	$(CARGO) build --release -p choir-tests --bin bench-memory
	target/release/bench-memory

# Copies what `make release` built: never builds (that would compile as root
# in the checkout) and never runs apt. BUILT names the binaries' directory.
BUILT ?= target/release
install:
	@for b in choird choir-agent choirctl; do \
	  [ -x $(BUILT)/$$b ] || { echo "install: $(BUILT)/$$b is missing: run \`make release\` as your user first" >&2; exit 1; }; \
	done
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/doc/choir/docs
	install -m 0644 README.md DESIGN.md $(DESTDIR)$(PREFIX)/share/doc/choir/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/choir/docs/
	install -m 0755 $(BUILT)/choird $(BUILT)/choir-agent $(BUILT)/choirctl $(DESTDIR)$(PREFIX)/bin/
	@# The man page and completions come from choirctl's own command definitions.
	install -d $(DESTDIR)$(MANDIR) $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	$(BUILT)/choirctl man > $(DESTDIR)$(MANDIR)/choirctl.1
	$(BUILT)/choirctl completions bash > $(DESTDIR)$(BASHCOMPDIR)/choirctl
	$(BUILT)/choirctl completions zsh > $(DESTDIR)$(ZSHCOMPDIR)/_choirctl
	$(BUILT)/choirctl completions fish > $(DESTDIR)$(FISHCOMPDIR)/choirctl.fish
	@# choir-db keeps the managed PostgreSQL across choird restarts (`choird cluster`).
	for u in choird choir-db; do \
	  sed 's|@PREFIX@|$(PREFIX)|g' packaging/$$u.service > $(DESTDIR)$(UNITDIR)/$$u.service && \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.service || exit 1; \
	done
	@if [ -z "$(DESTDIR)" ]; then ./scripts/install-user.sh; fi
	@echo "installed; start with: systemctl daemon-reload && systemctl enable --now choir-db choird"

# What `install` put in place; the home (/var/lib/choir) and the `choir`
# user stay (they hold the agents' data).
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/choird $(DESTDIR)$(PREFIX)/bin/choir-agent $(DESTDIR)$(PREFIX)/bin/choirctl
	rm -f $(DESTDIR)$(UNITDIR)/choird.service $(DESTDIR)$(UNITDIR)/choir-db.service
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/choir
	rm -f $(DESTDIR)$(MANDIR)/choirctl.1 $(DESTDIR)$(BASHCOMPDIR)/choirctl $(DESTDIR)$(ZSHCOMPDIR)/_choirctl $(DESTDIR)$(FISHCOMPDIR)/choirctl.fish

clean:
	$(CARGO) clean
