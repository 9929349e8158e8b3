"""The comparisons `scripts/reproduce.py` runs: one declaration per paper group, and the scales they run at.

A group is a list of variants (a source config file per scale plus the fields that make the variant), its
baseline, whether the paper matches FLOPs (then every variant gets the baseline's FLOPs, so cheaper variants train
on more tokens) or tokens, and the per-layer diagnostics its table reports (keys of `model.valuearch_diagnostics()`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scale:
    """How long every model of a group trains and on what blocks; "tiny" and "small" train the tiny configs
    (configs/tiny, configs/*/tiny*), "paper" reads block size, batch and budget from the baseline config's own
    "training" recipe instead."""

    name: str
    block_size: int | None
    batch_size: int | None
    baseline_tokens: float | None  # the baseline's training tokens; FLOP-matched groups convert them to FLOPs
    vocab_size: int | None  # the group tokenizer's vocabulary (None: the baseline config's)


SCALES = {
    # a smoke run: minutes for a group on 2 CPU cores
    "tiny": Scale("tiny", block_size=128, batch_size=8, baseline_tokens=200 * 8 * 128, vocab_size=512),
    # about an hour for all groups (2 seeds) on 2 CPU cores: 3x the tokens, 2x the context, 4x the vocabulary
    "small": Scale("small", block_size=256, batch_size=8, baseline_tokens=300 * 8 * 256, vocab_size=2048),
    "paper": Scale("paper", block_size=None, batch_size=None, baseline_tokens=None, vocab_size=None),
}


@dataclass(frozen=True)
class Variant:
    """One model of a group: `config` names its source file per scale ("tiny" also serves "small"), and
    `fields` (a dict, or a function of the source config's fields returning one) are set on top; a field set to
    None is removed, leaving the model type's default."""

    name: str
    config: dict[str, str]  # scale ("tiny" / "paper") -> config file, relative to the repository
    fields: dict | Callable[[dict], dict] = field(default_factory=dict)

    def fields_for(self, source: dict) -> dict:
        return self.fields(source) if callable(self.fields) else self.fields


@dataclass(frozen=True)
class Group:
    name: str
    paper: str
    variants: tuple[Variant, ...]  # the first is the baseline
    flop_matched: bool
    layer_statistics: tuple[str, ...]  # diagnostics reported per layer (mean over heads / entries)
    notes: str = ""
    # beyond the training length: held-out loss, and NIAH accuracy, at these multiples of the block size (NIAH
    # needs room for RULER's prompt plus 128 generated tokens, so it starts further out)
    loss_context_multiples: tuple[int, ...] = ()
    niah_context_multiples: tuple[int, ...] = ()

    @property
    def baseline(self) -> Variant:
        return self.variants[0]


def _bov_variants() -> tuple[Variant, ...]:
    """BoV Table 1's 13 rows and BoV itself (configs/value_paths, written by scripts/make_value_path_configs.py)."""
    rows = sorted(path.stem.removeprefix("tiny_") for path in (REPO / "configs" / "value_paths").glob("tiny_row*.json"))
    return tuple(Variant(name, {"tiny": f"configs/value_paths/tiny_{name}.json",
                                "paper": f"configs/value_paths/135m_{name}.json"}) for name in rows + ["bov"])


_SATFORMER = {"tiny": "configs/satformer/satformer_tiny.json", "paper": "configs/satformer/satformer_small.json"}
_RD = {"tiny": "configs/depth_routing/rd_attnres_tiny.json", "paper": "configs/depth_routing/rd_attnres_120m.json"}
_STANDARD_ROUTING = {"model_type": "valuearch", "attnres_block_size": None, "value_route": None}
_KVM_FIXED = {"tiny": "configs/kvm/tiny/kvm_fixed256.json", "paper": "configs/kvm/kvm_fixed256.json"}
_KVM_SQRT = {"tiny": "configs/kvm/tiny/kvm_sqrt16.json", "paper": "configs/kvm/kvm_sqrt16.json"}
_KVM_FIELDS = ("kvm_chunk_size", "kvm_window_chunks", "kvm_sink_slots", "kvm_state_schedule", "kvm_state_min_slots",
               "kvm_state_max_chunks", "kvm_growth_factor", "kvm_growth_exponent", "mixer_types")


def _full_attention_twin(kvm: dict) -> dict:
    """The KVM config's backbone with full causal attention in every layer."""
    return {"model_type": "valuearch", **dict.fromkeys(_KVM_FIELDS)}


def _sliding_window_twin(kvm: dict) -> dict:
    """The KVM config's backbone with a sliding window as long as KVM's raw window (kvm_window_chunks chunks)."""
    return {**_full_attention_twin(kvm), "mixer_types": ["sliding_attention"] * kvm["num_hidden_layers"],
            "sliding_window": kvm["kvm_window_chunks"] * kvm["kvm_chunk_size"]}


GROUPS = {
    "bov": Group(
        "bov", "Bank of Values (arXiv:2606.02780), Table 1", _bov_variants(), flop_matched=True,
        layer_statistics=("value_scale", "residual_scale", "source_scale"),
        notes="FLOP-matched as in the paper: table layers hold no v_proj, so they train on more tokens."),
    "satformer": Group(
        "satformer", "ResFormer (arXiv:2410.17897) and SATFormer (arXiv:2605.03953)",
        (Variant("baseline", _SATFORMER, {"model_type": "valuearch"}),
         Variant("resformer", _SATFORMER, {"model_type": "resformer"}),
         Variant("satformer", _SATFORMER)),
        flop_matched=False, layer_statistics=("v1_gate_zero_fraction",),
        notes="Every model is the SATFormer backbone and recipe (configs/satformer: satformer_tiny at tiny and small "
              "scale, satformer_small at paper scale; q/k norm, tied embeddings, AdamW with cosine decay); the "
              "baseline and ResFormer change only model_type to valuearch / resformer."),
    "rd_attnres": Group(
        "rd_attnres", "Block AttnRes (arXiv:2603.15031) and RD-AttnRes (arXiv:2608.01075)",
        (Variant("standard", _RD, _STANDARD_ROUTING),
         Variant("block_attnres", {"tiny": "configs/depth_routing/attnres_tiny.json",
                                   "paper": "configs/depth_routing/attnres_120m.json"}),
         Variant("rd_attnres", _RD),
         Variant("rd_attnres_tied", _RD, {"value_route": "tied"}),
         Variant("rd_attnres_average", _RD, {"value_route": "average"}),
         Variant("rd_attnres_frozen", _RD, {"value_route": "frozen"})),
        flop_matched=False, layer_statistics=("qk_value_js",)),
    "kvm": Group(
        "kvm", "Key-Value Means (arXiv:2605.09877)",
        (Variant("full_attention", _KVM_FIXED, _full_attention_twin),
         Variant("sliding_window", _KVM_FIXED, _sliding_window_twin),
         Variant("kvm_fixed256", _KVM_FIXED), Variant("kvm_sqrt16", _KVM_SQRT)),
        flop_matched=False, layer_statistics=("state_slots",), loss_context_multiples=(1, 2, 4, 8, 16),
        niah_context_multiples=(4, 8, 16),
        notes="The sliding window spans the KVM configs' raw window (kvm_window_chunks x kvm_chunk_size tokens)."),
}
