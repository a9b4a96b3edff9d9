"""ggml/fetch.py: the extracted tree is keyed on the pin and a hash of ggml/patches/*.patch, and an
extracted tree given as LUCEBOX_GGML_SOURCE is copied into the cache and patched there (never in
place). Runs on a fake llama.cpp tree and fake patches; no download, no archive."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FETCH = Path(__file__).resolve().parents[2] / "ggml" / "fetch.py"

PATCH = """--- a/ggml/src/op.c
+++ b/ggml/src/op.c
@@ -1 +1 @@
-int op(void) { return 1; }
+int op(void) { return 2; }
"""


@pytest.fixture()
def fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("lucebox_fetch_under_test", FETCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    here = tmp_path / "ggml"
    (here / "patches").mkdir(parents=True)
    monkeypatch.setattr(mod, "HERE", here)  # patches come from tmp_path/ggml/patches
    monkeypatch.setenv("LUCEBOX_CACHE_DIR", str(tmp_path / "cache"))
    return mod


def fake_tree(root: Path) -> Path:
    (root / "ggml" / "src").mkdir(parents=True)
    (root / "ggml" / "CMakeLists.txt").write_text("# fake\n")
    (root / "ggml" / "src" / "op.c").write_text("int op(void) { return 1; }\n")
    (root / "docs").mkdir()
    (root / "docs" / "big.md").write_text("skipped\n")
    return root


def test_patch_hash_keys_the_cache_directory(fetch) -> None:
    patches = fetch.HERE / "patches"
    none = fetch.patch_hash()
    d0 = fetch.dest_dir()
    assert d0.name.endswith(f"-p{none[:8]}") and fetch.PIN["sha256"][:8] in d0.name
    (patches / "0001-a.patch").write_text(PATCH)
    one = fetch.patch_hash()
    assert one != none and fetch.dest_dir() != d0
    (patches / "0001-a.patch").write_text(PATCH.replace("return 2", "return 3"))  # changed content
    assert fetch.patch_hash() not in (none, one)
    (patches / "0001-a.patch").write_text(PATCH)
    (patches / "0002-b.patch").write_text("")  # an added patch
    assert fetch.patch_hash() != one
    (patches / "notes.txt").write_text("not a patch")  # only *.patch count
    (patches / "0002-b.patch").unlink()
    assert fetch.patch_hash() == one


def test_source_tree_is_copied_and_patched_in_the_cache(fetch, tmp_path: Path) -> None:
    src = fake_tree(tmp_path / "upstream")
    (fetch.HERE / "patches" / "0001-a.patch").write_text(PATCH)
    root = fetch.resolve(str(src))
    assert root == fetch.dest_dir() and root != src
    assert (root / "ggml" / "src" / "op.c").read_text() == "int op(void) { return 2; }\n"
    assert (src / "ggml" / "src" / "op.c").read_text() == "int op(void) { return 1; }\n"  # untouched
    assert not (root / "docs").exists()
    assert (root / fetch.STAMP).read_text() == fetch.stamp_text()
    assert fetch.resolve(str(src)) == root  # complete: reused as is
    # a changed patch gives a new, freshly patched directory
    (fetch.HERE / "patches" / "0001-a.patch").write_text(PATCH.replace("return 2", "return 3"))
    root2 = fetch.resolve(str(src))
    assert root2 != root and (root2 / "ggml" / "src" / "op.c").read_text() == "int op(void) { return 3; }\n"


def test_a_stale_stamp_is_not_trusted(fetch, tmp_path: Path) -> None:
    src = fake_tree(tmp_path / "upstream")
    dest = fetch.dest_dir()
    dest.mkdir(parents=True)
    (dest / fetch.STAMP).write_text(fetch.PIN["sha256"] + "\n")  # an older stamp without the patch hash
    assert not fetch.is_complete(dest)
    root = fetch.resolve(str(src))
    assert fetch.is_complete(root) and (root / "ggml" / "CMakeLists.txt").is_file()


def test_bad_source_directory_is_refused(fetch, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no ggml/CMakeLists.txt"):
        fetch.resolve(str(tmp_path / "empty"))
