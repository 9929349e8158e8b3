"""One process of the 2-process CPU DDP check in test_conformance.py (run with torchrun, backend gloo).

For every registered model type and both `use_reentrant` values: DDP with gradient checkpointing on and
`find_unused_parameters=False` (what Trainer picks with gradient checkpointing) trains a few SGD steps, each rank on
its half of the batch; the weights must equal those of the same steps taken in one process on the whole batch.
"""

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch import MODEL_TYPES  # noqa: E402
from tests.test_conformance import conformance_ids, conformance_model  # noqa: E402

STEPS, LEARNING_RATE = 3, 0.5


def check(model_type: str, use_reentrant: bool, rank: int, world_size: int) -> None:
    reference = conformance_model(model_type).train()
    model = copy.deepcopy(reference)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    ddp = DistributedDataParallel(model, find_unused_parameters=False)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE)
    for step in range(STEPS):
        halves = conformance_ids(batch=2 * world_size, seed=step).chunk(world_size)
        optimizer.zero_grad()
        ddp(halves[rank], labels=halves[rank]).loss.backward()  # DDP averages the gradients of the ranks
        optimizer.step()
        reference_optimizer.zero_grad()
        sum(reference(ids, labels=ids).loss for ids in halves).div(world_size).backward()
        reference_optimizer.step()
    for (name, parameter), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(parameter, expected, rtol=1e-4, atol=1e-5,
                                   msg=f"{model_type} use_reentrant={use_reentrant}: {name}")


def main() -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    for model_type in sorted(MODEL_TYPES):
        for use_reentrant in (False, True):
            check(model_type, use_reentrant, rank, world_size)
        if rank == 0:
            print(f"ddp ok: {model_type}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
