"""What every conversion shares: carrying config fields over and copying weights into a new architecture."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# Bookkeeping fields that describe a saved checkpoint, not the model: never carried to a converted config.
NOT_CARRIED = frozenset({"model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "dtype"})


def carried_fields(source_config, target_config_class, exclude=()) -> dict:
    """The fields of `source_config` that `target_config_class` also has, minus bookkeeping and `exclude`."""
    return {
        name: value
        for name, value in source_config.to_dict().items()
        if name in target_config_class.__dataclass_fields__ and name not in NOT_CARRIED and name not in exclude
    }


def copy_weights(target, source, new_parameters: tuple[str, ...] = (), dropped: tuple[str, ...] = ()):
    """`target` holding every weight of `source`, in its dtype and on its device, in eval mode.

    Only parameters whose names contain one of `new_parameters` may be absent from `source` (they keep
    `target`'s initialisation), and only the weights named in `dropped` may be left out of `target` (e.g. the
    W_V of BoV table layers); anything else missing or left over raises ValueError.
    """
    target = target.to(dtype=source.dtype, device=source.device)
    weights = {name: weight for name, weight in source.state_dict().items() if name not in dropped}
    missing, unexpected = target.load_state_dict(weights, strict=False)
    tied_head = getattr(target.config, "tie_word_embeddings", False)
    missing = [name for name in missing if not any(part in name for part in new_parameters)
               and not (name == "lm_head.weight" and tied_head)]
    if missing or unexpected:
        raise ValueError(f"cannot convert {type(source).__name__} to {type(target).__name__}: weights missing "
                         f"{missing}, without a place {unexpected}")
    target.tie_weights()
    return target.eval()


# --- checkpoints written by the papers' own code (conversion/*_checkpoints.py) ---------------------------


def read_hf_checkpoint(directory) -> tuple[dict, dict]:
    """(config.json as a dict, state dict) of a Hugging Face-style checkpoint directory written by other code:
    model.safetensors, a sharded safetensors index, or pytorch_model.bin. Raises ValueError naming what is missing."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{str(directory)!r} has no config.json: expected a checkpoint directory written by "
                         "save_pretrained")
    config = json.loads((directory / "config.json").read_text())
    if (directory / "model.safetensors").is_file():
        return config, load_file(directory / "model.safetensors")
    if (directory / "model.safetensors.index.json").is_file():
        shards = set(json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"].values())
        return config, {name: tensor for shard in sorted(shards) for name, tensor in load_file(directory / shard).items()}
    if (directory / "pytorch_model.bin").is_file():
        return config, torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"{str(directory)!r} has no weights: expected model.safetensors, model.safetensors.index.json "
                     "or pytorch_model.bin")


def load_renamed(model, state_dict: dict, rename, source: str):
    """`model` (eval mode, in the source's dtype) holding `state_dict` with every name mapped by `rename(name)`.

    Every source tensor must find a place and every parameter of `model` must be filled (a tied head may come
    from the embeddings); otherwise ValueError naming the source's unsupported or missing weights.
    """
    renamed, unplaced = {}, []
    for name, tensor in state_dict.items():
        target = rename(name)
        if target is None:
            unplaced.append(name)
        else:
            renamed[target] = tensor
    if unplaced:
        raise ValueError(f"{source}: weights {sorted(unplaced)} belong to features hf_valuearch cannot represent")
    dtype = next(iter(state_dict.values())).dtype
    model = model.to(dtype)
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    tied_head = getattr(model.config, "tie_word_embeddings", False)
    missing = [name for name in missing if not (name == "lm_head.weight" and tied_head)]
    if missing or unexpected:
        raise ValueError(f"{source}: the checkpoint lacks weights {missing} and has weights without a place "
                         f"{unexpected}")
    model.tie_weights()
    return model.eval()


# nanoGPT's parameter names, kept by nanochat and the KVM paper -> ours: embeddings, head, and the attention and MLP
# projections of layer i (regex substitutions; each format adds its own and the first that matches wins)
NANOGPT_NAMES = [
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^lm_head\.", "lm_head."),
    (r"^transformer\.h\.(\d+)\.attn\.c_q\.", r"model.layers.\1.self_attn.q_proj."),
    (r"^transformer\.h\.(\d+)\.attn\.c_k\.", r"model.layers.\1.self_attn.k_proj."),
    (r"^transformer\.h\.(\d+)\.attn\.c_v\.", r"model.layers.\1.self_attn.v_proj."),
    (r"^transformer\.h\.(\d+)\.attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_fc\.", r"model.layers.\1.mlp.up_proj."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_proj\.", r"model.layers.\1.mlp.down_proj."),
]
