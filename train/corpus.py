"""The demo pair's corpus: the Python standard library of the running interpreter, split into
train and held-out files by a hash of each file's relative path (the same rule on every machine,
so held-out prompts can be drawn anywhere without shipping any of the text).

Importable without PyTorch (bench/bench_demo.py uses `code_prompts`).
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of every .py file of the standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")):
            continue
        out.append((rel, f))
    return out


def is_heldout(rel: str) -> bool:
    """5 % of files, chosen by a hash of the path: never trained on."""
    return int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % 20 == 0


def heldout_files() -> list[tuple[str, Path]]:
    return [(r, f) for r, f in stdlib_files() if is_heldout(r)]


def read_texts(files) -> list[str]:
    texts = []
    for _, f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def code_prompts(n: int = 20, n_lines: int = 12) -> list[str]:
    """`n` distinct prompts from held-out files: `n_lines` lines ending with the first `def` line
    that has that many lines before it (one prompt per file)."""
    prompts: list[str] = []
    for rel, f in heldout_files():
        try:
            lines = f.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(lines):
            if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and i >= n_lines:
                prompt = "\n".join(lines[i - n_lines + 1: i + 1]) + "\n"
                if prompt not in prompts:
                    prompts.append(prompt)
                break
        if len(prompts) == n:
            break
    return prompts
