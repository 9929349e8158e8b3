"""Checkpoints of SkyeGunasekaran/SATFormer (`SATFormerForCausalLM`, fla-style) -> `satformer`. Format
"satformer" of `scripts/convert.py --from`.

SATFormer is fla's transformer (conversion/fla_checkpoints.py) plus, in every layer >= 1 (or the last
`value_residual_last_k`), V' = V + ReLU(h W_alpha) V1 with h the attention-norm output and V1 layer 0's raw
v_proj output (`value_residual_mixing.alpha_proj`, one gate per KV head): our `relu_gate` value path on
`v1`, so each weight maps to one of ours and the conversion is exact by construction. The other gates of its
`ValueResidualMixing` (sigmoid, softmax, ...) and a gate bias have no equivalent here and are refused.
"""

from __future__ import annotations

from ..configuration_valuearch import SatFormerConfig, ValueArchConfig
from ..modeling_valuearch import SatFormerForCausalLM, ValueArchForCausalLM
from .common import load_renamed
from .fla_checkpoints import FLA_NAMES, read_fla_checkpoint, renamer

GATE_NAMES = [(r"^model\.layers\.(\d+)\.attn\.value_residual_mixing\.alpha_proj\.",
               r"model.layers.\1.self_attn.value_path.v1_gate.")]


def load_satformer(directory) -> ValueArchForCausalLM:
    """A SATFormer checkpoint directory -> SatFormerForCausalLM (ValueArchForCausalLM if the value residual is off)."""
    source = f"SATFormer checkpoint {str(directory)!r}"
    config, state_dict, fields = read_fla_checkpoint(directory, "SATFormer", "satformer", source)
    last_k, layers = config.get("value_residual_last_k"), config["num_hidden_layers"]
    value_layers = "all" if last_k is None else list(range(max(layers - last_k, 1), layers))  # layer 0 makes V1
    if not config.get("use_value_residual", True) or not value_layers:  # a plain fla transformer
        return load_renamed(ValueArchForCausalLM(ValueArchConfig(**fields)), state_dict, renamer(FLA_NAMES), source)
    if config.get("value_residual_gate", "relu") != "relu":
        raise ValueError(f"{source}: value_residual_gate={config['value_residual_gate']!r} is not supported: "
                         "hf_valuearch's SATFormer gate is ReLU ('relu')")
    if config.get("value_residual_proj_bias"):
        raise ValueError(f"{source}: value_residual_proj_bias=True (a bias on the gate W_alpha) is not supported")
    model = SatFormerForCausalLM(SatFormerConfig(**fields, value_layers=value_layers))
    return load_renamed(model, state_dict, renamer(GATE_NAMES + FLA_NAMES), source)
