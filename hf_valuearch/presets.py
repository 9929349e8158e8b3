"""The named architectures: one `Preset` per `model_type`, the single place a preset is declared.

Everything else is derived from `PRESETS`:

* the config class (`configuration_valuearch.py`: `{class_prefix}Config`, a `ValueArchConfig` subclass whose
  defaults are `Preset.defaults`) and the two model classes (`modeling_valuearch.py`: `{class_prefix}Model`,
  `{class_prefix}ForCausalLM`), module-level names so that a saved `auto_map` finds them under remote code;
* `hf_valuearch.MODEL_TYPES` and the Auto registration (`hf_valuearch/__init__.py`);
* the model card's paper line and citation (`hf_valuearch/cards/`);
* the conversion target `scripts/convert.py --to MODEL_TYPE` and its exactness report (`hf_valuearch/conversion/`).

A new preset is one entry below; `tests/test_presets.py` checks that every registered type has all of the above.
This module is carried inside checkpoints (configuration_valuearch.py imports it): standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Paper:
    """The paper a preset reproduces. `authors` are BibTeX names ("Last, First"; braces keep a team name whole)."""

    title: str
    authors: tuple[str, ...]
    year: int
    arxiv: str  # "2606.02780"

    @property
    def url(self) -> str:
        return f"https://arxiv.org/abs/{self.arxiv}"

    @property
    def citation(self) -> str:
        """The BibTeX entry, in arXiv's own export form."""
        first_author = self.authors[0].strip("{}").split(",")[0].split()[0].lower()
        first_word = "".join(c for c in self.title.split()[0].lower() if c.isalnum())
        return (
            f"@misc{{{first_author}{self.year}{first_word},\n"
            f"  title = {{{self.title}}},\n"
            f"  author = {{{' and '.join(self.authors)}}},\n"
            f"  year = {{{self.year}}},\n"
            f"  eprint = {{{self.arxiv}}},\n"
            "  archivePrefix = {arXiv},\n"
            f"  url = {{{self.url}}}\n"
            "}"
        )


@dataclass(frozen=True)
class ConversionTarget:
    """How `scripts/convert.py --to MODEL_TYPE` builds a preset from a Llama or standard valuearch model.

    converter: "module:function" of the converter in `hf_valuearch.conversion`.
    exact: given the source's config, whether the converted logits equal the source's by construction.
    note: what makes them differ (or, when exact, the condition under which they are equal).
    """

    converter: str
    exact: Callable[[object], bool]
    note: str


@dataclass(frozen=True)
class Preset:
    """One named architecture (its own `model_type`) over the three axes of `ValueArchConfig`.

    model_type: the registered type, the conversion target's name and the key of `PRESETS`.
    class_prefix: names the derived classes `{prefix}Config`, `{prefix}Model`, `{prefix}ForCausalLM`.
    mechanism: what the preset implements, in a few words (model cards, docstrings).
    summary: what it changes, in a sentence (model cards, the config class docstring).
    paper: the paper the defaults come from.
    defaults: the `ValueArchConfig` fields (or class-level settings such as `default_mixer_type`) whose defaults
        the preset changes; every value cites its source in a comment.
    conversion: how `scripts/convert.py --to MODEL_TYPE` makes this preset, and when that is exact.
    """

    model_type: str
    class_prefix: str
    mechanism: str
    summary: str
    paper: Paper
    conversion: ConversionTarget
    defaults: dict = field(default_factory=dict)


BASELINE = Preset(
    model_type="valuearch",
    class_prefix="ValueArch",
    mechanism="the standard pre-norm decoder of Llama, as a baseline",
    summary="A standard Llama decoder (RMSNorm, RoPE, SwiGLU, GQA), numerically the same model as transformers' "
            "LlamaForCausalLM.",
    paper=Paper(
        title="LLaMA: Open and Efficient Foundation Language Models",
        authors=("Touvron, Hugo", "Lavril, Thibaut", "Izacard, Gautier", "Martinet, Xavier", "Lachaux, Marie-Anne",
                 "Lacroix, Timothée", "Rozière, Baptiste", "Goyal, Naman", "Hambro, Eric", "Azhar, Faisal",
                 "Rodriguez, Aurelien", "Joulin, Armand", "Grave, Edouard", "Lample, Guillaume"),
        year=2023, arxiv="2302.13971",
    ),
    conversion=ConversionTarget("hf_valuearch.conversion:to_valuearch", exact=lambda source: True,
                                note="the same parameters under a renamed config"),
)

# --- value paths (value_paths.py, spec_value_paths.md) -----------------------------------------------------

BOV = Preset(
    model_type="bov",
    class_prefix="Bov",
    mechanism="Bank of Values",
    summary="The last third of the layers take their values from a per-layer token-id table, v = gamma * "
            "E_V[token_id], with E_V aligned at init to W_V RMSNorm(e).",
    paper=Paper(
        title="Do Value Vectors in Deep Layers Need Context from the Residual Stream?",
        authors=("He, Muyu", "Liu, Yuchen", "Huang, Qingya", "Zhang, Li"), year=2026, arxiv="2606.02780",
    ),
    conversion=ConversionTarget(
        "hf_valuearch.conversion.value_paths:to_bov",
        exact=lambda source: (getattr(source, "value_source", "residual") == "x0"
                              and getattr(source, "value_mix", None) == "substitute"),
        note="exact from an x0*W_V-substitutive source; from any other source the aligned tables "
             "E_V[t] = W_V RMSNorm(e[t]) replace h W_V in the value layers, which changes the model "
             "(BoV's step 0 equals x0*W_V substitution, not the source)",
    ),
    defaults={
        "value_source": "table",  # BoV §4: V replaced by a table lookup E_V[i_p]
        "value_mix": "substitute",  # BoV §4: "replaced"; registry gpt_base_v_from_value_emb_learn
        "value_coefficients": "learnable",  # BoV §4: gamma_v learnable, unbounded (learn_init_coeffs=True)
        "value_coefficient_init": None,  # -> [1.0]: BoV §4, gamma_v initialised to 1.0
        "value_layers": "last_third",  # BoV §4: layer_idx >= (2 * n_layer) // 3
    },
)

RESFORMER = Preset(
    model_type="resformer",
    class_prefix="ResFormer",
    mechanism="ResFormer value residual learning",
    summary="V_n' = lambda_1 V_1 + lambda_2 V_n in every layer n >= 2 (layer_idx >= 1), in the released identity "
            "form lambda_1 = lambda_2 = 0.5 (config: value_coefficient_init = [lambda_2, lambda_1], the "
            "coefficients of V_n and V_1); value_coefficients='learnable' is the learnable form.",
    paper=Paper(
        title="Value Residual Learning",
        authors=("Zhou, Zhanchao", "Wu, Tianyi", "Jiang, Zhiyun", "Obeid, Fares", "Lan, Zhenzhong"),
        year=2024, arxiv="2410.17897",
    ),
    conversion=ConversionTarget("hf_valuearch.conversion.value_paths:to_resformer", exact=lambda source: True,
                                note="alpha = 1 on V, beta = 0 on V1"),
    defaults={
        "value_source": "v1",  # ResFormer Eq. 5: V_1 = H_0 W_V^1
        "value_mix": "add",  # ResFormer Eq. 5: lambda_1 V_1 + lambda_2 V_n
        "value_coefficients": "fixed",  # Value-Residual-Learning modeling_llama_resformer.py: constant 0.5 / 0.5
        "value_coefficient_init": None,  # -> [0.5, 0.5]: same file, `0.5*v1 + 0.5*v`
        "value_layers": "all",  # same file: every layer after layer 0
    },
)

SATFORMER = Preset(
    model_type="satformer",
    class_prefix="SatFormer",
    mechanism="SATFormer selective access to early representations",
    summary="V' = V + ReLU(h W_alpha) V_1 in every layer >= 1, one gate per token and KV head.",
    paper=Paper(
        title="Transformers with Selective Access to Early Representations",
        authors=("Gunasekaran, Skye", "Wright, Téa", "Zhu, Rui-Jie", "Eshraghian, Jason"),
        year=2026, arxiv="2605.03953",
    ),
    conversion=ConversionTarget("hf_valuearch.conversion.value_paths:to_satformer", exact=lambda source: True,
                                note="W_alpha = 0, so every gate ReLU(h W_alpha) is 0"),
    defaults={
        "value_source": "v1",  # SATFormer Eq. 3: V1 = layer 0's raw v_proj output
        "value_mix": "relu_gate",  # SATFormer Eq. 3, ValueResidualMixing(gate="relu"), the default gate
        "value_coefficients": "learnable",  # W_alpha = Linear(hidden, num_kv_heads, bias=False), trained
        "value_layers": "all",  # SATFormer repo default: every layer > 0 (value_residual_last_k unset)
        "qk_norm": "rmsnorm",  # SATFormer configs: qk_norm=True (fla RMSNorm)
        # attn_satformer.py: q/k RMSNorm(head_dim) at fla's default eps; norm_eps 1e-6 elsewhere
        "qk_norm_eps": 1e-5,
        "tie_word_embeddings": True,  # SATFormer configs: tied embeddings
    },
)

# --- depth routing (depth_routing.py, spec_attnres.md) ---------------------------------------------------------

# why a conversion to (RD-)AttnRes from the standard residual stream is not exact
ZERO_QUERY_NOTE = ("zero pseudo-queries make every sublayer read h / n (n sources); RMSNorm(h / n) equals RMSNorm(h) "
                   "only up to its epsilon, a relative difference of at most eps (n^2 - 1) / (2 mean(h^2)) per norm: "
                   "small unless the residual stream is small")

ATTNRES = Preset(
    model_type="attnres",
    class_prefix="AttnRes",
    mechanism="Block Attention Residuals",
    summary="Each sublayer reads a softmax mixture of the block summaries and the current partial block over "
            "depth (learned pseudo-query per sublayer) instead of the residual stream.",
    paper=Paper(title="Attention Residuals", authors=("{Kimi Team}",), year=2026, arxiv="2603.15031"),
    conversion=ConversionTarget("hf_valuearch.conversion.depth_routing:valuearch_to_attnres",
                                exact=lambda source: False, note=ZERO_QUERY_NOTE),
    defaults={
        "depth_routing": "block_attnres",
        # S = 4 sublayers: Table 4's Block AttnRes (S = 2, 4, 8 tie); N = 8 blocks for 16 layers ("N ≈ 8", §3.2).
        "attnres_block_size": 4,
    },
)

RD_ATTNRES = Preset(
    model_type="rd_attnres",
    class_prefix="RdAttnRes",
    mechanism="Role-Decoupled Attention Residuals",
    summary="Block Attention Residuals with a separate depth read for the attention values (V route) next to the "
            "one for queries and keys.",
    paper=Paper(
        title="Role-Decoupled Attention Residuals: Separating Matching and Content Retrieval Across Depth",
        authors=("Wang, Kehan",), year=2026, arxiv="2608.01075",
    ),
    conversion=ConversionTarget(
        "hf_valuearch.conversion.depth_routing:to_rd_attnres",
        exact=lambda source: getattr(source, "depth_routing", "standard") == "block_attnres",
        note="exact from Block AttnRes (the V route starts as a copy of the Q/K route); from a standard-residual "
             f"source: {ZERO_QUERY_NOTE}",
    ),
    defaults={
        "depth_routing": "rd_attnres",
        # The RD-AttnRes abstract does not give the parent's block size; the Block AttnRes default (S = 4, Table 4).
        "attnres_block_size": 4,
        # "learning an independent value route" (RD-AttnRes abstract); the controls are the other values.
        "value_route": "learned",
    },
)

# --- sequence mixers (kvm.py, spec_kvm.md) ---------------------------------------------------------------------

KVM = Preset(
    model_type="kvm",
    class_prefix="Kvm",
    mechanism="Key-Value Means",
    summary="Every layer is a KVM layer: a block sliding window plus a compressed, growable state of key/value "
            "sums (here a fixed 256-slot state, the paper's `kvm_wd.yaml`, spec_kvm.md A.4, A.7); per-head "
            "LayerNorm of q and k and partial RoPE over the first half of each head with the paper's frequencies, "
            "whose rotary half the state keys zero (spec A.1).",
    paper=Paper(
        title="Key-Value Means: Transformers with Expandable Block-Recurrent Compressed Memory",
        authors=("Goldstein, Daniel", "Cheah, Eugene"), year=2026, arxiv="2605.09877",
    ),
    conversion=ConversionTarget(
        "hf_valuearch.conversion.kvm:llama_to_kvm", exact=lambda source: True,
        note="exact while the context fits in the KVM window (kvm_window_chunks * kvm_chunk_size tokens, which "
             "the probe does); beyond it the model reads the compressed state",
    ),
    defaults={
        # the other `kvm_*` defaults of the base config are the paper's (spec A.2, A.7)
        "default_mixer_type": "kvm",  # every layer's mixer when `mixer_types` is not given
        # spec A.1: rope_partial_dim 64 of d_head 128 (read when rope_parameters lacks it)
        "partial_rotary_factor": 0.5,
        "qk_norm": "layernorm",  # spec A.1: per-head LayerNorm on q and k
        "qk_norm_eps": 1e-5,  # value_residual_mixin.py: ln_q, ln_k = nn.LayerNorm(d_head), eps 1e-5
        # the paper's frequencies (1/θ)^linspace(0, 1, n), θ = 10000 (rwkv7_backbone.py RotaryEmbedding; rope_theta
        # 10000 in configs/prolong), unless `rope_parameters` is given
        "rope_parameters": {"rope_type": "linspace"},
    },
)

# model_type -> its declaration; the baseline first.
PRESETS: dict[str, Preset] = {
    preset.model_type: preset for preset in (BASELINE, BOV, RESFORMER, SATFORMER, ATTNRES, RD_ATTNRES, KVM)
}

__all__ = ["ConversionTarget", "Paper", "Preset", "PRESETS"]
