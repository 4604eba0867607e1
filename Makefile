# Tandem: `make run` serves the built-in model on 127.0.0.1:8000; `make test` builds and tests.
# Everything else is a detail of these two. Build outputs go to build/ (release) and
# build-fuzz/ (clang + libFuzzer + sanitizers).

BUILD      ?= build
FUZZ_BUILD ?= build-fuzz
AARCH64_BUILD ?= build-aarch64
JOBS       ?= $(shell nproc)
PORT       ?= 8000
HOST       ?= 127.0.0.1
MODEL      ?= models/builtin
FUZZ_SECONDS ?= 30

.PHONY: all deps build test test-unit test-fuzz test-e2e test-gpu test-aarch64 run bench bench-serving mutation mutation-gpu clean builtin-model

all: build

deps:
	@bash tools/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	@bash tools/run-tests.sh $(BUILD) $(FUZZ_BUILD) $(FUZZ_SECONDS)

test-e2e: build
	bash tools/e2e.sh echo: $(BUILD)
	bash tools/smoke-builtin.sh $(BUILD)
	bash tools/bench-e2e.sh $(BUILD)
	bash tools/ops-smoke.sh $(BUILD)

test-unit: build
	cd $(BUILD) && ctest --output-on-failure

test-gpu: build
	@bash tools/run-gpu-tests.sh $(BUILD)

# The CPU build cross-compiled for aarch64 (the GB10 hosts), every unit suite run under qemu:
# bench/results/aarch64-emulated-<date>.json. `make test` runs its smoke (the CPU ops' suite).
test-aarch64: deps
	@JOBS=$(JOBS) bash tools/aarch64/run.sh full $(AARCH64_BUILD); rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 77 ]

builtin-model: build
	@bash tools/builtin-model.sh $(BUILD)/tandem $(MODEL)

run: builtin-model
	$(BUILD)/tandem serve --model $(MODEL) --served-model-name builtin --host $(HOST) --port $(PORT) \
	  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' $(SERVE_ARGS)

bench: build
	@bash tools/run-bench.sh $(BUILD)

# Serving load against the built-in model (64 clients, 60 s): bench/results/serving-load-builtin-<date>.json.
bench-serving: build
	@bash tools/serving-load.sh builtin $(BUILD)

# Mutation check: applies each fault of tools/mutation/faults.json to a scratch copy, builds and runs
# the affected tests, prints which tests catch it; fails if any fault goes uncaught.
mutation:
	@python3 tools/mutation/mutate.py

# The same for the CUDA kernels where a GPU is (tools/mutation/faults-gpu.json, tools/mutation/gpu.py):
# builds test_cuda_ops once per fault (sm_90a by default), runs each with the tests that should catch
# it; bench/results/mutation-gpu-<date>-<gpu>.json. A GPU host that cannot build runs an archive made
# elsewhere: `mutate.py --gpu --build-only DIR` there, `mutate.py --gpu --run DIR/mutation-gpu.tar.xz` here.
mutation-gpu:
	@python3 tools/mutation/mutate.py --gpu

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(AARCH64_BUILD)
