"""Parameter split and FLOPs per token (hf_valuearch/training/accounting.py) on shapes counted by hand, and
against the BoV paper's token counts for its FLOP budgets."""


import pytest
import torch

from hf_valuearch import MODEL_TYPES
from hf_valuearch.training import load_config
from hf_valuearch.training.accounting import (flops_breakdown, flops_per_token, parameter_split,
                                              shortest_block_training_every_parameter)
from tests.common import REPO, random_ids

# vocab 99, hidden 32, intermediate 37, 3 layers, 4 heads of 8, 2 KV heads
SHAPES = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2)
V, D, I, L, KV_DIM = 99, 32, 37, 3, 16
LAYER_MATRICES = 2 * D * D + 2 * KV_DIM * D + 3 * I * D  # q, o, k, v, gate, up, down
LAYER_NORMS = 2 * D


def config(model_type, **overrides):
    return MODEL_TYPES[model_type][0](**{**SHAPES, **overrides})


def model(model_type, **overrides):
    return MODEL_TYPES[model_type][2](config(model_type, **overrides))


def test_standard_decoder_by_hand():
    assert parameter_split(model("valuearch")) == {"dense": 2 * V * D + L * (LAYER_MATRICES + LAYER_NORMS) + D,
                                                   "table": 0, "routing": 0}
    # 6 N over the matrices and the head (not the input embedding), 12 h q T per layer
    assert flops_breakdown(config("valuearch"), 16) == {
        "matmul": 6.0 * (L * LAYER_MATRICES + V * D), "attention": 12.0 * 4 * 8 * 16 * L, "depth_routing": 0.0}


def test_tied_head_counts_once_in_parameters_and_as_a_matmul():
    untied, tied = config("valuearch"), config("valuearch", tie_word_embeddings=True)
    assert parameter_split(model("valuearch", tie_word_embeddings=True))["dense"] == (
        parameter_split(model("valuearch"))["dense"] - V * D)
    assert flops_per_token(tied, 16) == flops_per_token(untied, 16)


def test_bov_tables_are_lookups_and_table_layers_have_no_v_proj():
    split = parameter_split(model("bov"))  # layer 2 (the last third) reads its values from a table
    assert split["table"] == V * KV_DIM
    assert split["dense"] == parameter_split(model("valuearch"))["dense"] - KV_DIM * D + 1  # - v_proj + gamma
    assert flops_breakdown(config("bov"), 16)["matmul"] == 6.0 * (L * LAYER_MATRICES - KV_DIM * D + V * D)


def test_sliding_window_attends_its_window():
    sliding = config("valuearch", mixer_types=["sliding_attention", "full_attention", "sliding_attention"],
                     sliding_window=4)
    assert flops_breakdown(sliding, 16)["attention"] == 12.0 * 4 * 8 * (4 + 16 + 4)


def test_kvm_attends_window_plus_state():
    kvm = config("kvm", kvm_chunk_size=4, kvm_state_min_slots=4)  # window 2 chunks = 8 tokens, 4 state slots
    assert flops_breakdown(kvm, 16)["attention"] == 12.0 * 4 * 8 * (8 + 4) * L
    assert flops_breakdown(kvm, 8)["attention"] == 12.0 * 4 * 8 * 8 * L  # all still in the window
    grows = config("kvm", kvm_chunk_size=4, kvm_state_min_slots=4, kvm_state_max_chunks=4,
                   kvm_state_schedule="power_law", kvm_growth_factor=2.0)
    # chunks leave the window at covered = 4, 8, 12; targets floor(2 sqrt(8 + covered)) = 6, 8, 8 (min 4, max 16)
    assert flops_breakdown(grows, 24)["attention"] == 12.0 * 4 * 8 * (8 + 8) * L


@pytest.mark.parametrize("model_type", ["attnres", "rd_attnres"])
def test_depth_routing_parameters_and_reads(model_type):
    # block size 4 over 6 sublayers: reads see 1, 2, 2, 2, 2, 3 inputs, the final read 3
    split = parameter_split(model(model_type))
    queries_per_layer = 3 if model_type == "rd_attnres" else 2
    assert split["routing"] == L * (queries_per_layer + 2) * D + 2 * D  # queries + key norms, final read
    reads = 15 + (1 + 2 + 2 if model_type == "rd_attnres" else 0)  # RD: attention reads mix twice
    assert flops_breakdown(config(model_type), 16)["depth_routing"] == 12.0 * reads * D


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_split_covers_every_used_parameter(model_type):
    lm = model(model_type)
    split = parameter_split(lm)
    total = sum(p.numel() for p in lm.parameters())
    assert sum(split.values()) == total
    assert flops_per_token(lm.config, 32) > flops_per_token(lm.config, 16) > 6 * split["dense"] * 0.5


@pytest.mark.parametrize("name, budget, tokens", [
    ("135m_row01_baseline", 1.5e18, 1.97e9),  # BoV §5: 1.5e18 FLOPs, 1.97B tokens
    ("780m_row01_baseline", 3.91e19, 8.19e9),  # BoV §5: 8.19B tokens for the baseline at 780M
    ("780m_bov", 3.91e19, 8.39e9),  # ... and 8.39B for BoV (its tables are lookups)
])
def test_paper_token_counts(name, budget, tokens):
    paper_config = load_config(str(REPO / "configs" / "value_paths" / f"{name}.json"))
    assert budget / flops_per_token(paper_config, 2048) == pytest.approx(tokens, rel=5e-3)


@pytest.mark.parametrize("seq_len", [0, -3, 2.5, True])
def test_bad_sequence_length(seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(config("valuearch"), seq_len)


TINY_KVM = sorted((REPO / "configs" / "kvm" / "tiny").glob("*.json"))
TINY_KVM_SQRT16 = REPO / "configs" / "kvm" / "tiny" / "kvm_sqrt16.json"


# every tiny KVM config, and a state growing by whole chunks (16 sqrt(T)) whose appends are not gated: its merge
# gate first trains at the first merge, 273 tokens
UNGATED_APPENDS = {"kvm_merge_gate_appends": False, "kvm_growth_factor": 16.0}


@pytest.mark.parametrize("path, overrides", [(path, {}) for path in TINY_KVM] + [(TINY_KVM_SQRT16, UNGATED_APPENDS)],
                         ids=[path.stem for path in TINY_KVM] + ["kvm_sqrt16_ungated_appends"])
def test_shortest_block_training_every_kvm_parameter(path, overrides):
    """One token less leaves a parameter (state key norm or merge gate) without a gradient; that length trains all."""
    kvm = load_config(str(path), overrides)
    shortest = shortest_block_training_every_parameter(kvm)
    for length in (shortest - 1, shortest):
        torch.manual_seed(0)
        lm = MODEL_TYPES["kvm"][2](kvm)
        ids = random_ids(1, length, kvm.vocab_size)
        lm(ids, labels=ids).loss.backward()
        untrained = [name for name, parameter in lm.named_parameters() if parameter.grad is None]
        assert bool(untrained) == (length < shortest), (length, untrained)
    assert shortest_block_training_every_parameter(load_config("valuearch")) is None
