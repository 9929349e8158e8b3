"""scripts/bench.py plumbing (no timings): suite selection errors, ratios to Llama and to the parent, targets."""

import runpy

import pytest

from tests.common import REPO, run_script

bench = runpy.run_path(str(REPO / "scripts" / "bench.py"), run_name="bench")


def test_unknown_suite_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script("bench", "trainig")
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "unknown suite(s) ['trainig']" in error and "'training'" in error and "Traceback" not in error


def test_ratios_to_llama_and_parent_are_speed_ratios():
    row = bench["row"]
    rows = bench["add_ratios"]([
        row("training", "llama", "training tokens/s", 100.0, "tokens/s", True),
        row("training", "valuearch", "training tokens/s", 95.0, "tokens/s", True),
        row("training", "attnres", "training tokens/s", 76.0, "tokens/s", True),
        row("training", "rd_attnres", "training tokens/s", 57.0, "tokens/s", True),
        row("training", "attnres" + bench["COMPILED"], "training tokens/s", 114.0, "tokens/s", True),
        row("inference", "llama", "prefill s", 2.0, "s", False),
        row("inference", "valuearch", "prefill s", 4.0, "s", False),
        row("memory", "bov", "cache bytes measured / formula", 1.0, "x", True),
        row("inference", "kvm", "decode tokens/s (1024 context)", 10.0, "tokens/s", True),  # not the kvm suite's
        row("kvm", bench["KVM"], "decode tokens/s (1024 context)", 50.0, "tokens/s", True),
        row("kvm", bench["KVM"], "decode tokens/s (16384 context)", 48.0, "tokens/s", True),
        row("kvm", bench["FULL"], "layer prefill s (16384 tokens)", 10.0, "s", False),
        row("kvm", bench["KVM"], "layer prefill s (16384 tokens)", 2.0, "s", False),
    ])
    by_name = {(r["metric"], r["candidate"]): r for r in rows}
    assert by_name[("training tokens/s", "rd_attnres")]["ratio_to_llama"] == pytest.approx(0.57)
    assert by_name[("training tokens/s", "rd_attnres")]["ratio_to_parent"] == pytest.approx(0.75)  # parent: attnres
    assert by_name[("training tokens/s", "attnres")]["ratio_to_parent"] == pytest.approx(0.8)  # parent: standard
    compiled = by_name[("training tokens/s", "attnres" + bench["COMPILED"])]
    assert compiled["ratio_to_parent"] == pytest.approx(1.5) and compiled["ratio_to_llama"] == pytest.approx(1.14)
    assert by_name[("prefill s", "valuearch")]["ratio_to_llama"] == pytest.approx(0.5)  # twice the time: 0.5
    assert by_name[("cache bytes measured / formula", "bov")]["ratio_to_llama"] is None

    targets = {t["target"]: t for t in bench["targets"](rows)}
    assert targets["standard / Llama training tokens/s"]["met"] is True  # 0.95
    assert targets["Block AttnRes / standard training tokens/s"]["met"] is False  # 0.8
    assert targets["RD-AttnRes / Block AttnRes training tokens/s"]["ratio"] == pytest.approx(0.75)
    assert targets["BoV cache bytes, measured / formula"]["met"] is True
    assert targets["KVM decode tokens/s, 16k / 1k context"]["ratio"] == pytest.approx(0.96)
    assert targets["KVM layer prefill speed-up over full attention, 16k"]["ratio"] == pytest.approx(5.0)
    assert by_name[("layer prefill s (16384 tokens)", bench["KVM"])]["ratio_to_parent"] == pytest.approx(5.0)
    assert targets["KVM layer prefill speed-up over full attention, 1k"]["met"] is None  # not measured
    assert "| Block AttnRes / standard training tokens/s | 0.8 | >= 0.9 | **no** |" in bench["markdown"](
        rows, list(targets.values()))
