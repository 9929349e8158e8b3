"""Write configs/value_paths/*.json: the BoV paper's 12-layer ablation table (arXiv:2606.02780 Table 1, 13 rows)
at a tiny size and at the paper's 135M size (d12), plus BoV itself at d12 and BoV and the baseline at 780M (d24).

    python scripts/make_value_path_configs.py [--out configs/value_paths]

Backbone: BoV's nanochat (`gpt_base.py`; BoV Table 6, spec_value_paths.md §1.4 / §2.1): vocab 32768, head_dim
128, MLP width 4d with ReLU², RMSNorm of the embeddings, smear gate, weightless RMSNorms (epsilon: float32's, what
`F.rms_norm` uses on float32 activations), q/k RMSNorm then ×1.2, logit soft-capping 15, RoPE base 100000, untied
embeddings, nanochat's initialisation, sequence 2048, window pattern SSSL with nanochat's short window (512, 0),
i.e. 513 keys (the last layer always long). What still differs: configs/value_paths/README.md.
File names: <size>_<row>_<variant>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# BoV Table 1: row -> (variant name, value-path fields). "last 4" of 12 layers = last third.
ABLATION_ROWS = {
    1: ("baseline", dict(model_type="valuearch")),
    2: ("v_scale_last_third_learned", dict(value_source="residual", value_layers="last_third",
                                           value_coefficients="learnable")),
    3: ("v1_all_fixed", dict(value_source="v1", value_layers="all")),
    4: ("v1_every_other_learned", dict(value_source="v1", value_layers="every_other", value_coefficients="learnable")),
    5: ("v1_last_third_fixed", dict(value_source="v1", value_layers="last_third")),
    6: ("v1_last_third_learned", dict(value_source="v1", value_layers="last_third", value_coefficients="learnable")),
    7: ("x0_every_other_learned", dict(value_source="x0", value_layers="every_other", value_coefficients="learnable")),
    8: ("x0_last_third_fixed", dict(value_source="x0", value_layers="last_third")),
    9: ("x0_last_third_learned", dict(value_source="x0", value_layers="last_third", value_coefficients="learnable")),
    10: ("v_plus_v1_fixed", dict(value_source="v1", value_layers="last_third", value_mix="add",
                                 value_coefficient_init=[0.5, 0.5])),
    # learned alpha, beta: BoV `learn_init_coeffs` initialises alpha = 1 (on V), beta = 0 (on the extra values)
    11: ("v_plus_v1_learned", dict(value_source="v1", value_layers="last_third", value_mix="add",
                                   value_coefficients="learnable", value_coefficient_init=[1.0, 0.0])),
    12: ("v_plus_x0_fixed", dict(value_source="x0", value_layers="last_third", value_mix="add",
                                 value_coefficient_init=[0.5, 0.5])),
    13: ("v_plus_x0_learned", dict(value_source="x0", value_layers="last_third", value_mix="add",
                                   value_coefficients="learnable", value_coefficient_init=[1.0, 0.0])),
}
BOV = ("bov", dict(model_type="bov"))  # BoV §4 (defaults of the bov preset)


def backbone(depth: int, hidden: int, heads: int, vocab: int, window: int, seq: int) -> dict:
    """nanochat's GPT at this size; `window` is nanochat's left window (window, 0), which attends window + 1 keys."""
    return dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=depth,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
        max_position_embeddings=seq, mlp_activation="relu2", qk_norm="rmsnorm", qk_scale=1.2, norm_weights=False,
        embedding_norm=True, smear_gate=True, initialization="nanochat", rms_norm_eps=torch.finfo(torch.float32).eps,
        final_logit_softcapping=15.0, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=False,
        mixer_types=["full_attention" if i % 4 == 3 or i == depth - 1 else "sliding_attention" for i in range(depth)],
        sliding_window=window + 1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )


SIZES = {
    "tiny": backbone(depth=4, hidden=64, heads=4, vocab=256, window=8, seq=256),
    "135m": backbone(depth=12, hidden=768, heads=6, vocab=32768, window=512, seq=2048),  # BoV d12
    "780m": backbone(depth=24, hidden=1536, heads=12, vocab=32768, window=512, seq=2048),  # BoV d24
}


def variants(size: str) -> dict[str, dict]:
    rows = {f"row{row:02d}_{name}": fields for row, (name, fields) in ABLATION_ROWS.items()}
    if size == "780m":  # BoV Table 2: BoV and the baseline
        rows = {"row01_baseline": ABLATION_ROWS[1][1]}
    rows[BOV[0]] = BOV[1]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="configs/value_paths")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for size, fields in SIZES.items():
        for name, value_path in variants(size).items():
            config = {"model_type": "valuearch", **fields, **value_path}
            (out / f"{size}_{name}.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
