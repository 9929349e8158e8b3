"""transformers 5.23 / 5.24 compatibility.

5.24 renamed the cache argument and output field from ``past_key_values`` to ``cache`` (forward
signatures, output dataclasses, what ``generate`` passes and reads). Everything version-specific in
this package goes through the two names below.
"""

from __future__ import annotations

from transformers.modeling_outputs import BaseModelOutputWithPast

# Name of the cache field in transformers' output dataclasses: "cache" (>= 5.24) or "past_key_values".
CACHE_OUTPUT_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def pop_cache(cache, kwargs: dict):
    """Return the cache whichever name the caller used (`cache=` in 5.24, `past_key_values=` in 5.23)."""
    legacy = kwargs.pop("past_key_values", None)
    return cache if cache is not None else legacy


def output_cache(output):
    """Read the cache from a model output under either transformers version."""
    return getattr(output, CACHE_OUTPUT_FIELD)
