"""bench/probes/ab_sums.py: the product probe's A/B tables summed per variant (min over rounds)."""
import importlib.util
import re
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "probes" / "ab_sums.py"
_spec = importlib.util.spec_from_file_location("ab_sums", _PATH)
ab_sums = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_sums)

_HEAD = "Q4_K weights, row-tiled layout\ndevice copy bandwidth: 3.05 TB/s (read + write)\n" \
        "matrix                                       N         us      TB/s  of copy\n"


def _table(rows):
    return _HEAD + "".join(f"{shape:<44} {n:>2} {us:>10.1f}      2.00      66%\n" for shape, n, us in rows)


def _ab_output():
    return ("=== test a: passed (all passed)\n=== test b: passed (all passed)\n"
            "=== a 1 --q4k\n" + _table([("ffn_down (17408 -> 5120)", 1, 20.0), ("attn_k / attn_v (5120 -> 1024)", 1, 5.0),
                                          ("ffn_down (17408 -> 5120)", 16, 30.0)]) +
            "=== b 1 --q4k\n" + _table([("ffn_down (17408 -> 5120)", 1, 19.0), ("attn_k / attn_v (5120 -> 1024)", 1, 6.0),
                                          ("ffn_down (17408 -> 5120)", 16, 31.0)]) +
            "=== a 2 --q4k\n" + _table([("ffn_down (17408 -> 5120)", 1, 18.5), ("attn_k / attn_v (5120 -> 1024)", 1, 5.5),
                                          ("ffn_down (17408 -> 5120)", 16, 29.0)]) +
            "=== b 2 --q4k\n" + _table([("ffn_down (17408 -> 5120)", 1, 19.5), ("attn_k / attn_v (5120 -> 1024)", 1, 4.0)]) +
            "=== a 1\n" + _table([("ffn_down (17408 -> 5120)", 1, 33.0)]))


def test_minimum_over_rounds_and_sums(tmp_path, capsys):
    f = tmp_path / "ab.txt"
    f.write_text(_ab_output())
    times, variants = ab_sums.parse(f.read_text().splitlines())
    assert variants == ["a", "b"]  # the test verdicts are not variants
    assert times[("--q4k", 1, "ffn_down (17408 -> 5120)")] == {"a": 18.5, "b": 19.0}
    assert times[("--q4k", 1, "attn_k / attn_v (5120 -> 1024)")] == {"a": 5.0, "b": 4.0}
    assert times[("(none)", 1, "ffn_down (17408 -> 5120)")] == {"a": 33.0}
    assert ab_sums.main([str(f), "--shapes"]) == 0
    out = capsys.readouterr().out.splitlines()
    sums = {tuple(line.split()[:2]): line.split()[3:] for line in out if line.startswith(("--q4k", "(none)"))}
    assert sums[("--q4k", "1")] == ["23.5", "23.0"]
    assert sums[("--q4k", "16")] == ["29.0", "31.0"]
    assert sums[("(none)", "1")] == ["33.0", "-"]  # b never ran without flags: no sum, not 0
    assert any("b: no time for 1 of the 1 shapes" in line for line in out)


def test_variant_order_and_errors(tmp_path, capsys):
    f = tmp_path / "ab.txt"
    f.write_text(_ab_output())
    assert ab_sums.main([str(f), "--variants", "b,a"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-2:] == ["b", "a"]
    with pytest.raises(SystemExit):
        ab_sums.main([str(f), "--variants", "a,c"])
    assert "no runs of c" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("=== test a: FAILED\n")
    assert ab_sums.main([str(empty)]) == 1


def test_fit_recovers_rate_and_fixed_cost(tmp_path, capsys):
    # times made as 2 us + MB / 2.5 TB/s (Q4_K: 144 bytes a 256 weights) are fitted back (to the
    # tables' 0.1 us rounding); variant b's are 1 us slower a product at the same rate
    shapes = ["ffn gate+up fused (5120 -> 2x17408)", "ffn_down (17408 -> 5120)", "attn_k / attn_v (5120 -> 1024)"]
    mb = [5120 * 17408 * 2 * 144 / 256 / 1e6, 17408 * 5120 * 144 / 256 / 1e6, 5120 * 1024 * 144 / 256 / 1e6]
    text = "".join(f"=== {v} 1 --q4k\n" + _table([(s, 1, extra + 2.0 + x / 2.5) for s, x in zip(shapes, mb)])
                   for v, extra in (("a", 0.0), ("b", 1.0)))
    f = tmp_path / "ab.txt"
    f.write_text(text)
    assert ab_sums.weight_formats(text.splitlines()) == {"--q4k": "Q4_K"}
    assert ab_sums.main([str(f), "--fit"]) == 0
    fits = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fit")]
    assert len(fits) == 2
    got = [re.search(r" (\w): ([\d.]+) TB/s streaming \+ ([\d.]+) us a product \(Q4_K, 3 shapes\)", line) for line in fits]
    assert [(m[1], float(m[2])) for m in got] == [("a", 2.5), ("b", 2.5)]
    assert float(got[0][3]) == pytest.approx(2.0, abs=0.1) and float(got[1][3]) == pytest.approx(3.0, abs=0.1)
    # one shape alone cannot be fitted: no line, not a made-up one
    f.write_text("=== a 1 --q4k\n" + _table([(shapes[1], 1, 20.0)]))
    assert ab_sums.main([str(f), "--fit"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("fit")]
