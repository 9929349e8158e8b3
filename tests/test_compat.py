"""transformers 5.23 / 5.24: one code path, checked under both versions.

The suite runs under the installed transformers (5.24). The 5.23 check runs this file's
`CROSS_VERSION_SCRIPT` in a subprocess with transformers 5.23 first on the path, installed by
`.ci/run` into `.venv-tf523` (`pip install --no-deps --target .venv-tf523 transformers==5.23.0`).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transformers

from hf_valuearch.compat import CACHE_OUTPUT_FIELD, pop_cache

REPO = Path(__file__).resolve().parent.parent
TF523 = REPO / ".venv-tf523"

CROSS_VERSION_SCRIPT = textwrap.dedent("""
    import torch, transformers
    from hf_valuearch.compat import CACHE_OUTPUT_FIELD, output_cache
    from tests.common import random_ids, tiny_model
    print("transformers", transformers.__version__, CACHE_OUTPUT_FIELD)
    model = tiny_model()
    ids = random_ids(2, 12)
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :8], use_cache=True)
        cache = output_cache(out)
        steps = [out.logits] + [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                                for t in range(8, 12)]
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-5
    mask = torch.ones_like(ids)
    a = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    b = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(a, b)
    print("ok")
""")


def test_pop_cache_accepts_either_name():
    assert pop_cache("new", {}) == "new"
    kwargs = {"past_key_values": "old", "other": 1}
    assert pop_cache(None, kwargs) == "old" and kwargs == {"other": 1}
    expected = "cache" if transformers.__version__ >= "5.24" else "past_key_values"
    assert CACHE_OUTPUT_FIELD == expected


def test_same_code_runs_under_transformers_5_23():
    if not (TF523 / "transformers").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{TF523} is missing: .ci/run installs transformers 5.23 there")
        pytest.skip("transformers 5.23 not installed in .venv-tf523 (see this module's docstring)")
    env = {**os.environ, "PYTHONPATH": f"{TF523}{os.pathsep}{REPO}"}
    result = subprocess.run([sys.executable, "-c", CROSS_VERSION_SCRIPT], cwd=REPO, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformers 5.23.0 past_key_values" in result.stdout and result.stdout.strip().endswith("ok")
