"""What every conversion shares: carrying config fields over and copying weights into a new architecture."""

from __future__ import annotations

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
