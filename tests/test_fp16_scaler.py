"""float16 with its gradient scaler, run for real on the CPU with 2 gloo processes: the loss
is scaled, the gradients are unscaled before value clipping, a step whose gradients
overflow is skipped on every rank (weights unchanged, the scale lowered), and the scaler's
state travels in checkpoints so that a resumed run ends as the uninterrupted one.

An overflow is forced with a huge initial loss scale (2^40), lowered by 2^-8 at each
overflow, so that a few steps overflow and the later ones do not."""

import copy

import numpy as np
import pytest
import torch
from model_fixtures import make_model, random_batch
from test_distributed import _args, _spawn_on_toy

from gears_ddp.data.cells import PertBatch
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.rank_training import spawned_rank
from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.model.losses import LossContext
from gears_ddp.model.model_folder import read_weights
from gears_ddp.runtime.ranks import ProcessGroupRanks
from gears_ddp.training.checkpoint import checkpoint_files, load_training_checkpoint
from gears_ddp.training.engine import Precision, batch_loss, training_step

pytestmark = pytest.mark.distributed

HIGH_SCALE, BACKOFF = 2.0**40, 2.0**-8
STEPS = 6
CPU = torch.device("cpu")


def high_scale_scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=HIGH_SCALE, backoff_factor=BACKOFF)


def _batch(seed: int) -> PertBatch:
    x, pert_idx = random_batch(seed=seed)
    return PertBatch(
        x=x,
        y=x + 0.1,
        pert_idx=pert_idx,
        condition=(pert_idx[:, 0] + 1) % 6,
        de_idx=torch.full((len(x), 20), -1),
        condition_names=[str(i) for i in range(6)],
    )


def _scaled_steps(local_rank, port, messages):
    """``STEPS`` float16 optimiser steps of a model on 2 ranks, on this rank's batches; for each:
    the scale before and after, whether the weights changed, the largest gradient value that
    clipping saw, and that of full-precision gradients of the same step (both ranks'
    batches, as the ranks average them)."""
    setup_ddp(local_rank, 2, "cpu", "127.0.0.1", port)
    try:
        messages.put((local_rank, _steps(local_rank)))
    finally:
        cleanup_ddp()


def _steps(local_rank) -> list[dict]:
    ranks = ProcessGroupRanks()
    network = make_model().train()
    ranks.share_parameters(network)
    gradients = ranks.gradient_average(network)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    precision = Precision(torch.float16, high_scale_scaler())
    context = LossContext(torch.ones(6, 40, dtype=torch.bool), torch.zeros(40))
    seen_at_clipping = []
    clip = torch.nn.utils.clip_grad_value_

    def recording_clip(parameters, clip_value, **options):
        parameters = list(parameters)
        seen_at_clipping.append(max(float(p.grad.abs().max()) for p in parameters if p.grad is not None))
        return clip(parameters, clip_value, **options)

    torch.nn.utils.clip_grad_value_ = recording_clip
    records = []
    for step in range(STEPS):
        batches = [_batch(seed=10 * step + rank) for rank in (0, 1)]
        references = [copy.deepcopy(network) for _ in batches]  # each rank's copy (BatchNorm sees its batch)
        for reference, batch in zip(references, batches):
            batch_loss(reference, batch, context, False).backward()
        full_precision = max(
            float(sum(r.get_parameter(name).grad for r in references).abs().max()) / 2
            for name, p in network.named_parameters()
            if references[0].get_parameter(name).grad is not None
        )
        # this rank's copy ran the same forward pass, which renormalises the embeddings in place
        # (max_norm): the weights a skipped step must leave
        forward_only = dict(references[local_rank].named_parameters())
        scale_before = precision.scaler.get_scale()
        training_step(network, [batches[local_rank]], optimizer, context, False, CPU, precision, gradients)
        records.append(
            {
                "scale_before": scale_before,
                "scale_after": precision.scaler.get_scale(),
                "changed": any(not torch.equal(forward_only[name], p) for name, p in network.named_parameters()),
                "optimizer_steps": max((int(state["step"]) for state in optimizer.state.values()), default=0),
                "at_clipping": seen_at_clipping[-1],
                "full_precision": full_precision,
                "weights": {name: p.detach().numpy().copy() for name, p in network.named_parameters()},
            }
        )
    return records


def test_fp16_steps_scale_unscale_before_clipping_and_skip_overflows_on_every_rank():
    results = dict(spawn_workers(_scaled_steps, (find_free_port(),), 2))
    ours, theirs = results[0], results[1]
    skipped = [not record["changed"] for record in ours]
    assert skipped[0] and not skipped[-1], skipped  # the forced overflows, then steps that apply
    assert [record["optimizer_steps"] for record in ours] == list(np.cumsum([not s for s in skipped]))
    for record, other in zip(ours, theirs):
        assert record["changed"] == other["changed"] and record["scale_after"] == other["scale_after"]
        for name, value in record["weights"].items():  # the ranks stay identical, skipped steps included
            np.testing.assert_array_equal(value, other["weights"][name], err_msg=name)
        if record["changed"]:  # an applied step keeps the scale (it grows only after 2000 clean steps)
            assert record["scale_after"] == record["scale_before"]
            # clipping saw the true gradients: unscaled, as large as full precision's within float16's
            # rounding, where still scaled they would be record["scale_before"] (256 or more) times larger
            assert 0.5 < record["at_clipping"] / record["full_precision"] < 2
            assert record["scale_before"] >= 256
        else:  # a skipped step: weights untouched (checked above), the scale lowered by the backoff
            assert record["scale_after"] == record["scale_before"] * BACKOFF
    assert ours[-1]["scale_after"] < HIGH_SCALE


def test_a_forced_overflow_skips_the_step_and_lowers_the_scale_in_one_process():
    network = make_model().train()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    precision = Precision(torch.float16, high_scale_scaler())
    context = LossContext(torch.ones(6, 40, dtype=torch.bool), torch.zeros(40))
    forward_only = copy.deepcopy(network)
    batch_loss(forward_only, _batch(seed=3), context, False)  # the forward pass's own in-place renormalisation
    loss = training_step(network, [_batch(seed=3)], optimizer, context, False, CPU, precision)
    assert torch.isfinite(loss)  # the loss is fine; its scaled gradients overflowed float16
    assert precision.scaler.get_scale() == HIGH_SCALE * BACKOFF
    assert optimizer.state == {}  # no optimiser step was taken
    assert all(torch.equal(forward_only.get_parameter(name), value) for name, value in network.named_parameters())


def _worker_with_a_high_loss_scale(local_rank, *args):
    """A rank whose float16 scaler starts at ``HIGH_SCALE``, so that its state matters."""
    from gears_ddp.training import engine

    for_mode = engine.Precision.for_mode.__func__

    def high_scale(cls, amp, device):
        precision = for_mode(cls, amp, device)
        return cls(precision.dtype, high_scale_scaler()) if precision.scaler is not None else precision

    engine.Precision.for_mode = classmethod(high_scale)
    spawned_rank(local_rank, *args)


def test_fp16_resumes_exactly_with_the_scaler_state_of_its_checkpoint(data_folder, tmp_path):
    fp16 = {"amp": "fp16", "checkpoint_every": 1}
    _spawn_on_toy(data_folder, _worker_with_a_high_loss_scale, tmp_path / "whole", epochs=2, **fp16)
    after_one_epoch = checkpoint_files(tmp_path / "whole")[0]
    state = load_training_checkpoint(after_one_epoch)
    assert state["position"]["epoch"] == 1
    assert state["scaler"]["scale"] < HIGH_SCALE  # steps were skipped: the state carries that
    _spawn_on_toy(
        data_folder,
        _worker_with_a_high_loss_scale,
        tmp_path / "resumed",
        epochs=2,
        resume_from=str(after_one_epoch),
        **fp16,
    )
    whole, resumed = (load_training_checkpoint(checkpoint_files(tmp_path / name)[-1]) for name in ("whole", "resumed"))
    assert whole["scaler"] == resumed["scaler"]
    for name, value in whole["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    saved = [read_weights(tmp_path / name) for name in ("whole", "resumed")]
    assert all(torch.equal(saved[0][name], saved[1][name]) for name in saved[0])


def test_fp16_trains_two_cpu_ranks_through_train_multi_gpu(data_folder, tmp_path):
    from gears_ddp import train_multi_gpu

    report = train_multi_gpu(
        data_folder, "toy", {"split": "simulation", "seed": 1}, _args(tmp_path / "fp16", epochs=1, amp="fp16")
    )
    assert np.isfinite(report["model"]["test_mse_de"]) and len(set(report["parameter_digests"])) == 1
