"""Logging the depth-routing diagnostics during training (not shipped with checkpoints)."""

from __future__ import annotations

from transformers import TrainerCallback

from ..depth_routing import BlockAttnResRouter, record_depth_routes


class DepthRouteLoggingCallback(TrainerCallback):
    """Adds depth-routing diagnostics to every Trainer log: per layer, the weight the attention Q/K route
    puts on the embedding and, for RD-AttnRes, the Q/K-vs-V Jensen-Shannon divergence and its mean over
    layers ("depth/mean_qk_value_js"). They come from the last training forward, recorded without graphs
    (`record_depth_routes`), so logging costs no extra forward pass."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        record_depth_routes(model, True)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        record_depth_routes(model, False)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        routers = [module for module in model.modules() if isinstance(module, BlockAttnResRouter)]
        entries, js = {}, []
        for layer_idx, router in enumerate(routers):
            report = router.diagnostics()
            if "attention_qk" not in report:  # nothing recorded yet
                continue
            entries[f"depth/layer_{layer_idx}/attention_qk_embedding_weight"] = report["attention_qk"][0]
            if "qk_value_js" in report:
                entries[f"depth/layer_{layer_idx}/qk_value_js"] = report["qk_value_js"]
                js.append(report["qk_value_js"])
        if js:
            entries["depth/mean_qk_value_js"] = sum(js) / len(js)
        # the Trainer appends `logs` to log_history before calling callbacks: update both
        logs.update(entries)
        if state.log_history:
            state.log_history[-1].update(entries)
