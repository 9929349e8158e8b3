"""configs/value_paths/: every row of the BoV ablation table (arXiv:2606.02780 Table 1) at tiny and 135M size,
BoV and the baseline at 780M; the files load, name the right variant, and the tiny ones build and run."""

import json
from pathlib import Path

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from scripts.make_value_path_configs import main as make_configs

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "value_paths"
FILES = sorted(CONFIG_DIR.glob("*.json"))

# BoV Table 1 as printed: row -> (value source, layers of 12, coefficient); "last 4" of 12 = layers 8-11.
TABLE_1 = {
    1: ("V", None, None), 2: ("V", [8, 9, 10, 11], "gamma"), 3: ("V1", list(range(1, 12)), "1"),
    4: ("V1", [1, 3, 5, 7, 9, 11], "gamma"), 5: ("V1", [8, 9, 10, 11], "1"), 6: ("V1", [8, 9, 10, 11], "gamma"),
    7: ("x0W_V", [1, 3, 5, 7, 9, 11], "gamma"), 8: ("x0W_V", [8, 9, 10, 11], "1"),
    9: ("x0W_V", [8, 9, 10, 11], "gamma"), 10: ("V+V1", [8, 9, 10, 11], "0.5/0.5"),
    11: ("V+V1", [8, 9, 10, 11], "learned"), 12: ("V+x0W_V", [8, 9, 10, 11], "0.5/0.5"),
    13: ("V+x0W_V", [8, 9, 10, 11], "learned"),
}


def load(path: Path):
    data = json.loads(path.read_text())
    return MODEL_TYPES[data["model_type"]][0].from_json_file(path)


def describe(config) -> tuple:
    """(value source, layers, coefficient) in the notation of BoV Table 1."""
    if not config.value_layer_indices:
        return ("V", None, None)
    name = {"residual": "V", "v1": "V1", "x0": "x0W_V", "table": "E_V"}[config.value_source]
    if config.value_mix == "add":
        name = f"V+{name}"
        coefficient = "learned" if config.value_coefficients == "learnable" else "/".join(
            str(c) for c in config.value_coefficient_values)
    else:
        coefficient = "gamma" if config.value_coefficients == "learnable" else str(int(config.value_coefficient_values[0]))
    return (name, config.value_layer_indices, coefficient)


def test_files_are_what_the_generator_writes(tmp_path):
    make_configs(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in FILES]
    for path in FILES:
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name
    assert len(FILES) == 2 * 13 + 2 + 2


@pytest.mark.parametrize("row", sorted(TABLE_1))
def test_135m_rows_match_table_1(row):
    (path,) = CONFIG_DIR.glob(f"135m_row{row:02d}_*.json")
    config = load(path)
    assert describe(config) == TABLE_1[row]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.vocab_size) == (768, 12, 6, 6, 128, 32768)


def parameter_count(config) -> float:
    """Millions of matrix and table parameters, counted on the meta device (nothing is allocated). Norm weights
    are left out: nanochat's norms, which the paper's counts describe, have none."""
    with torch.device("meta"):
        model = MODEL_TYPES[config.model_type][2](config)
    return sum(p.numel() for p in model.parameters() if p.ndim == 2) / 1e6


@pytest.mark.parametrize("size, baseline, tables", [("135m", 135.3, 100.7), ("780m", 780.1, 402.7)])
def test_paper_sizes_and_bov_table_parameters(size, baseline, tables):
    """BoV §4 / spec §1.2: d12 135.3M + 100.7M table parameters, d24 780.1M + 402.7M."""
    bov = load(CONFIG_DIR / f"{size}_bov.json")
    assert bov.model_type == "bov" and bov.value_layer_indices == list(range(2 * bov.num_hidden_layers // 3,
                                                                             bov.num_hidden_layers))
    baseline_count = parameter_count(load(CONFIG_DIR / f"{size}_row01_baseline.json"))
    assert round(baseline_count, 1) == baseline
    w_v = bov.hidden_size * bov.num_key_value_heads * bov.head_dim / 1e6  # table layers hold none (BoV: dead c_v)
    assert round(parameter_count(bov) - baseline_count + len(bov.value_layer_indices) * w_v, 1) == tables


@pytest.mark.parametrize("path", [p for p in FILES if p.name.startswith("tiny_")], ids=lambda p: p.stem)
def test_tiny_configs_build_and_run(path):
    config = load(path)
    name = path.stem.removeprefix("tiny_")
    if name != "bov":
        source, layers_of_12, coefficient = TABLE_1[int(name[3:5])]
        assert describe(config)[0] == source and describe(config)[2] == coefficient
    torch.manual_seed(0)
    model = MODEL_TYPES[config.model_type][2](config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 12))
    assert torch.isfinite(model(ids).logits).all()
