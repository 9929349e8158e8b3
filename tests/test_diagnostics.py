"""Live diagnostics (hf_valuearch/training/diagnostics.py): every model type's mechanisms reach TensorBoard, the
CSV and the final PNG during a Trainer run."""

import csv
import math

import pytest
from transformers import Trainer, TrainingArguments

from hf_valuearch import MODEL_TYPES
from hf_valuearch.training.diagnostics import DiagnosticsCallback, flatten_diagnostics
from tests.common import tiny_model
from tests.test_training import RepeatedSequences

# a statistic each mechanism must report (the baseline reports none)
EXPECTED = {
    "valuearch": [], "resformer": [],  # fixed 0.5 / 0.5 coefficients are not parameters: nothing to follow
    "bov": ["layers.2.value_path/value_scale"],
    "satformer": ["layers.1.value_path/v1_gate_mean/0", "layers.2.value_path/v1_gate_zero_fraction/1"],
    "attnres": ["layers.1.router/attention_qk/0", "layers.1.router/attention_qk_entropy", "readout/final_entropy"],
    "rd_attnres": ["layers.2.router/qk_value_js", "layers.2.router/attention_value_entropy"],
    "kvm": ["layers.0.sequence_mixer/state_slots/0", "layers.0.sequence_mixer/state_coverage"],
}


def test_flatten_adds_entropies_and_coverage():
    report = {"model.layers.1.router": {"attention_qk": [0.5, 0.5], "qk_value_js": 0.25},
              "model.layers.0.self_attn.sequence_mixer": {"tokens_in_state": [30, 10], "window_tokens": [10, 10]}}
    flat = flatten_diagnostics(report)
    assert flat["layers.1.router/attention_qk/1"] == 0.5 and flat["layers.1.router/qk_value_js"] == 0.25
    assert flat["layers.1.router/attention_qk_entropy"] == pytest.approx(math.log(2))
    assert flat["layers.0.sequence_mixer/state_coverage"] == pytest.approx((0.75 + 0.5) / 2)


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_trainer_run_writes_diagnostics(model_type, tmp_path):
    model = tiny_model(model_type, **({"kvm_chunk_size": 4, "kvm_state_min_slots": 4} if model_type == "kvm" else {}))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-2, use_cpu=True, report_to=[], logging_steps=2, save_strategy="no",
                             disable_tqdm=True)
    Trainer(model=model.train(), args=args, train_dataset=RepeatedSequences(),
            callbacks=[DiagnosticsCallback(tmp_path)]).train()
    with open(tmp_path / "diagnostics.csv") as file:
        rows = list(csv.DictReader(file))
    names = {row["name"] for row in rows}
    assert {"loss", "grad_norm"} <= names
    for name in EXPECTED[model_type]:
        assert f"diagnostics/{name}" in names, sorted(names)
        assert [row["step"] for row in rows if row["name"] == f"diagnostics/{name}"] == ["2", "4"]
    assert (tmp_path / "diagnostics.png").stat().st_size > 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    if model_type == "rd_attnres":  # the learned value route moves away from the Q/K route (JS 0 at step 0)
        js = [float(row["value"]) for row in rows if row["name"] == "diagnostics/layers.2.router/qk_value_js"]
        assert js[-1] > 0
    routers = [m for m in model.modules() if hasattr(m, "record_routes")]
    assert not any(router.record_routes for router in routers)  # recording switched off at the end
