#!/usr/bin/env python3
"""Obtain the pinned upstream llama.cpp / ggml source tree, outside the source checkout.

The pin (ggml/pin.json) names one PyPI source distribution, `llama-cpp-python==0.3.36`, whose
`vendor/llama.cpp` subtree is the llama.cpp commit and ggml version lucebox builds on. This script

1. takes the source from `LUCEBOX_GGML_SOURCE` (or `--source`) when set: a path to the downloaded
   archive (verified against the pinned sha256), or to an already extracted, unpatched tree (the
   sdist root, its `vendor/llama.cpp`, or any directory containing `ggml/CMakeLists.txt`), for
   offline builds;
2. otherwise downloads the archive from PyPI into the cache and verifies its sha256;
3. extracts the llama.cpp subtree (without its models, docs and media), or copies the given tree,
   into `$LUCEBOX_CACHE_DIR/llama.cpp-<version>-<sha8>-p<patch8>/` (default cache:
   ~/.cache/lucebox; `<patch8>` hashes ggml/patches/*.patch, so adding or changing a patch
   re-extracts into a new directory and a given source tree is never patched in place),
4. applies ggml/patches/*.patch in name order, and
5. prints the absolute path of the llama.cpp root (the directory holding `ggml/`).

The extraction is atomic (temp dir + rename) and marked complete with a stamp file naming the pin
sha and the patch hash, so an interrupted run never leaves a half tree behind. Nothing from
upstream is written into the repo.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIN = json.loads((HERE / "pin.json").read_text())
SKIP_TOP = {"models", "docs", "media", ".git", "benches"}
STAMP = ".lucebox-extracted"


def log(msg: str) -> None:
    print(f"[lucebox ggml] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("LUCEBOX_CACHE_DIR") or os.path.join(Path.home(), ".cache", "lucebox")
    return Path(root).expanduser().resolve()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_archive(path: Path) -> None:
    got = sha256_of(path)
    if got != PIN["sha256"]:
        raise SystemExit(
            f"{path}: sha256 {got} does not match the pinned {PIN['sha256']} "
            f"({PIN['package']}=={PIN['version']}); refusing to build from it"
        )


def archive_url() -> str:
    """Resolve the sdist URL through PyPI's JSON simple API (PEP 691)."""
    index = f"https://pypi.org/simple/{PIN['package']}/"
    req = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    for f in files:
        if f["filename"] == PIN["archive"]:
            return f["url"]
    raise SystemExit(f"{PIN['archive']} not listed on {index}")


def download(dest: Path) -> None:
    url = archive_url()
    log(f"downloading {url}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=300) as resp:
            shutil.copyfileobj(resp, out, 1 << 20)
        verify_archive(Path(tmp))
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def patch_files() -> list[Path]:
    return sorted((HERE / "patches").glob("*.patch"))


def patch_hash() -> str:
    """sha256 over the patch files' names and contents, in application order."""
    h = hashlib.sha256()
    for patch in patch_files():
        h.update(patch.name.encode() + b"\0")
        h.update(patch.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def stamp_text() -> str:
    return f"{PIN['sha256']} patches {patch_hash()}\n"


def dest_dir() -> Path:
    return cache_dir() / f"llama.cpp-{PIN['version']}-{PIN['sha256'][:8]}-p{patch_hash()[:8]}"


def is_complete(dest: Path) -> bool:
    stamp = dest / STAMP
    return stamp.is_file() and stamp.read_text() == stamp_text()


def extract(archive: Path | None, dest: Path, tree: Path | None = None) -> None:
    """Fill `dest` from the archive's llama.cpp subtree, or from a copy of an extracted `tree`."""
    prefix = f"{PIN['archive'].removesuffix('.tar.gz')}/{PIN['subtree']}/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".extract-"))
    try:
        if tree is not None:
            for entry in tree.iterdir():
                if entry.name in SKIP_TOP or entry.name == STAMP:
                    continue
                if entry.is_dir():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name)
        else:
            assert archive is not None
            with tarfile.open(archive, "r:gz") as tar:
                members = []
                for m in tar.getmembers():
                    if not m.name.startswith(prefix):
                        continue
                    rel = m.name[len(prefix):]
                    if not rel or rel.split("/", 1)[0] in SKIP_TOP:
                        continue
                    if not (m.isfile() or m.isdir()):
                        continue  # no links or devices from an archive
                    m.name = rel
                    members.append(m)
                tar.extractall(tmp, members=members, filter="data")
        apply_patches(tmp)
        (tmp / STAMP).write_text(stamp_text())
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def apply_patches(tree: Path) -> None:
    for patch in patch_files():
        log(f"applying {patch.name}")
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)], cwd=tree, check=True,
                       stdout=sys.stderr)  # stdout carries only the resulting path


def find_root(path: Path) -> Path | None:
    for cand in (path, path / PIN["subtree"], path.parent):
        if (cand / "ggml" / "CMakeLists.txt").is_file():
            return cand.resolve()
    return None


def resolve(source: str | None) -> Path:
    dest = dest_dir()
    if source:
        src = Path(source).expanduser().resolve()
        if src.is_dir():
            root = find_root(src)
            if root is None:
                raise SystemExit(f"LUCEBOX_GGML_SOURCE={src}: no ggml/CMakeLists.txt found in it")
            if root == dest and is_complete(dest):
                return dest  # already our patched copy
            if not is_complete(dest):
                log(f"copying {root} into {dest} and patching it")
                extract(None, dest, tree=root)
            return dest
        if not src.is_file():
            raise SystemExit(f"LUCEBOX_GGML_SOURCE={src}: no such file or directory")
        verify_archive(src)
        archive = src
    else:
        archive = cache_dir() / PIN["archive"]
    if is_complete(dest):
        return dest
    if not archive.is_file():
        download(archive)
    else:
        verify_archive(archive)
    log(f"extracting into {dest}")
    extract(archive, dest)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=os.environ.get("LUCEBOX_GGML_SOURCE") or None,
                    help="archive or extracted tree to use instead of downloading")
    args = ap.parse_args()
    print(resolve(args.source))


if __name__ == "__main__":
    main()
