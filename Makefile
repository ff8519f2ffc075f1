# Stallfree. `make demo` runs the main job; `make test` runs the tests.
GO      ?= go
BIN     := bin
export CGO_ENABLED ?= 0

.PHONY: build test test-deps test-short test-hosts fuzz lint demo clean mutate

build:
	$(GO) build -o $(BIN)/ ./cmd/cachenode ./cmd/cachectl

# -race needs cgo; the binaries themselves are static. The Python loader
# tests run on Debian's python3-torch, python3-msgpack, python3-numpy,
# python3-pil and python3-boto3 (they belong to /usr/bin/python3, not to a
# pyenv python3 earlier on PATH). Pillow is installed so that the image
# decode path is always tested; test_decode also runs a child without it.
# boto3 uploads the examples' data to MinIO. prometheus brings promtool, which
# checks deploy/prometheus's alert rules.
PYTHON ?= /usr/bin/python3
test: build test-deps
	STALLFREE_MINIO=$$(./scripts/minio.sh) CGO_ENABLED=1 $(GO) test -race -count=1 -tags minio -timeout 20m ./...
	cd deploy/kubernetes && $(GO) test -count=1 ./...  # the manifests (a module of its own: docs/kubernetes.md)
	cd bench && CGO_ENABLED=1 $(GO) test -race -count=1 ./...
	$(PYTHON) -W ignore::ResourceWarning -m unittest discover -s python/tests -v

# Installs what `make test` needs when it is missing: as root through
# apt-get, otherwise it stops with the one command to run.
TEST_DEBS := gcc libc6-dev python3-torch python3-torchvision python3-msgpack python3-numpy python3-pil python3-boto3 python3-crc32c prometheus
test-deps:
	@./scripts/test-deps.sh $(PYTHON) $(TEST_DEBS)

test-short:
	STALLFREE_MINIO=$$(./scripts/minio.sh) CGO_ENABLED=1 $(GO) test -race -short -count=1 ./...
	cd bench && CGO_ENABLED=1 $(GO) test -race -short -count=1 ./...

# The multi-host testbed (needs root): each node in its own network
# namespace with its own address, links limited by tc. The FIGURE lines are
# the figures docs/hosts.md keeps.
test-hosts:
	@rc=0; CGO_ENABLED=1 $(GO) test -tags hosts -count=1 -timeout 30m -v -run '^TestHosts' ./integration || rc=$$?; \
		./scripts/hosts-clean.sh; exit $$rc

# Brief runs of every fuzz target (CI runs these too).
FUZZTIME ?= 15s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzValidKey$$' -fuzztime $(FUZZTIME) ./source
	$(GO) test -run '^$$' -fuzz '^FuzzKeyPath$$' -fuzztime $(FUZZTIME) ./httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzValidName$$' -fuzztime $(FUZZTIME) ./httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME) ./transport
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeItemWrites$$' -fuzztime $(FUZZTIME) ./httpapi

# Mutation testing of the core packages (not in CI: about 15 minutes here).
# The table it prints is kept in docs/testing.md.
mutate:
	./scripts/mutate.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags minio ./source  # the S3 tests' MinIO tier
	cd deploy/kubernetes && $(GO) vet ./...
	cd bench && $(GO) vet ./...
	./scripts/check-layers.sh

demo: build
	./scripts/demo.sh

clean:
	rm -rf $(BIN) demo-data "$${XDG_CACHE_HOME:-$$HOME/.cache}/stallfree/demo"

# --- containers (DESIGN §6) -------------------------------------------------
COMPOSE ?= docker-compose
IMAGE   := stallfree:local

.PHONY: image minio-image cluster-data cluster-up cluster-up-s3 cluster-down test-docker

image:
	rm -rf deploy/rootfs && mkdir -p deploy/rootfs/tmp deploy/rootfs/var/lib/stallfree
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o deploy/rootfs/ ./cmd/cachenode ./cmd/cachectl
	chmod 1777 deploy/rootfs/tmp
	@docker image rm $(IMAGE) >/dev/null 2>&1 || true  # no dangling image left behind by a rebuild
	docker build -q -t $(IMAGE) deploy
	@docker image inspect $(IMAGE) --format 'image $(IMAGE): {{.Size}} bytes'

CLUSTER_ITEMS ?= 2000
CLUSTER_SIZE  ?= 110KiB
cluster-data: build
	@if [ -d data ] && [ -n "$$(ls -A data)" ]; then echo "./data exists; keeping it"; \
	else bin/cachectl gendata data --items $(CLUSTER_ITEMS) --size $(CLUSTER_SIZE); fi

# The token and key are generated once, kept out of git and out of the image,
# and handed to the containers as files (compose secrets). The directory is
# private; the files inside are readable so the unprivileged node can read
# its bind-mounted copy.
SECRETS := .cluster/token .cluster/cluster.key .cluster/s3-credentials
$(SECRETS):
	./scripts/cluster-secrets.sh .cluster

cluster-up: image cluster-data $(SECRETS)
	$(COMPOSE) up -d
	@for n in 1 2 3; do for i in $$(seq 150); do \
		bin/cachectl --node http://127.0.0.1:717$$n --token-file .cluster/token health 2>/dev/null && break; sleep 0.2; done; done
	bin/cachectl --node http://127.0.0.1:7171 --token-file .cluster/token members

# The same cluster reading s3://demo/data from a MinIO container.
cluster-up-s3: cluster-up minio-image
	$(COMPOSE) --profile s3 up -d minio s3-upload
	@test "$$(docker wait $$($(COMPOSE) --profile s3 ps -q s3-upload))" = 0 || { $(COMPOSE) --profile s3 logs s3-upload; exit 1; }
	bin/cachectl --node http://127.0.0.1:7171 --token-file .cluster/token datasets add demo-s3 s3://demo/data

cluster-down:
	$(COMPOSE) --profile scale --profile s3 down -v --remove-orphans
	@docker image rm $(IMAGE) $(MINIO_IMAGE) >/dev/null 2>&1 || true  # either may be absent
	rm -rf deploy/rootfs deploy/minio-rootfs

MINIO_IMAGE := stallfree-minio:local
minio-image:
	rm -rf deploy/minio-rootfs && mkdir -p deploy/minio-rootfs/tmp deploy/minio-rootfs/var/lib/minio
	cp "$$(./scripts/minio.sh)" deploy/minio-rootfs/minio
	chmod 1777 deploy/minio-rootfs/tmp
	@docker image rm $(MINIO_IMAGE) >/dev/null 2>&1 || true
	docker build -q -t $(MINIO_IMAGE) -f deploy/Dockerfile.minio deploy

test-docker:
	CGO_ENABLED=1 $(GO) test -race -count=1 -tags docker -timeout 30m -run Docker ./integration

# --- benchmarks (DESIGN §5) -------------------------------------------------
.PHONY: bench bench-deps
bench-deps:
	@missing=""; for p in nginx memcached wrk; do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light memcached wrk; fi

# Writes BENCHMARKS.md and docs/bench/ (plots, results.json). About 4 minutes,
# then the loader bench (python -m stallfree.bench, ~3 minutes; its section of
# BENCHMARKS.md). LOADER_BENCH_FLAGS=--quick for a short one. bench/ is a
# module of its own (its go.mod replaces stallfree with this checkout), so the
# product's go.mod carries no plotting library.
BENCH_FLAGS ?=
LOADER_BENCH_FLAGS ?=
bench: build bench-deps
	cd bench && $(GO) build -o ../$(BIN)/sfbench ./cmd/sfbench
	$(BIN)/sfbench -minio $$(./scripts/minio.sh) $(BENCH_FLAGS)
	cd python && $(PYTHON) -m stallfree.bench --markdown ../BENCHMARKS.md $(LOADER_BENCH_FLAGS)
