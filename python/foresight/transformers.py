"""Hugging Face ``Trainer.train()`` as a Foresight worker: the Trainer keeps its loop (data
loading, gradient accumulation and clipping, mixed precision, logging); the parameter server
applies the updates::

    import foresight, foresight.torch, foresight.transformers

    job = foresight.init()
    torch.manual_seed(job.seed)                        # the same initial model on every worker
    model = AutoModelForCausalLM.from_config(config)
    opt = foresight.torch.Optimizer(model)             # joins the job
    trainer = Trainer(
        model=model,
        args=TrainingArguments(..., num_train_epochs=job.epochs, per_device_train_batch_size=job.batch_size),
        train_dataset=foresight.transformers.shard(train),   # this worker's share
        optimizers=(opt, None),                        # the PS's update instead of AdamW
        callbacks=[foresight.transformers.Callback()],
    )
    trainer.train()                                    # ends with the PS's final model in `model`

The Trainer's learning rate and schedule are not used: the parameter server applies the job's
``training.learningRate`` and schedule. A replaced worker process counts the steps its earlier
process already put in the model and stops when the worker's share of the job is done.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from transformers import TrainerCallback

import foresight
import foresight.torch

__all__ = ["Callback", "shard"]


def shard(dataset: Any) -> Any:
    """This worker's share of ``dataset``: ``foresight.shard``'s examples, cut to the same count
    on every worker (so every worker takes the same number of steps, as ``sync`` rounds need).
    A ``datasets.Dataset`` stays one (``select``); any other dataset becomes a ``Subset``."""
    j = foresight.job()
    n = len(dataset)
    mine = foresight.shard(n)[: n // j.workers]
    if not mine:
        raise foresight.ForesightError(f"worker {j.worker}'s share of {n} examples is empty")
    if hasattr(dataset, "select"):
        return dataset.select(mine)
    return torch.utils.data.Subset(dataset, mine)


def _foresight_optimizer(optimizer: Any) -> foresight.torch.Optimizer:
    """The Trainer's optimizer, unwrapped from accelerate's ``AcceleratedOptimizer``."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, foresight.torch.Optimizer):
        raise foresight.ConfigError(
            f"the Trainer's optimizer is a {type(inner).__name__}: pass "
            "optimizers=(foresight.torch.Optimizer(model), None) to Trainer(...) so that the "
            "parameter server applies the updates"
        )
    return inner


class Callback(TrainerCallback):
    """Ties a ``transformers.Trainer`` to the job: the epochs of the PS's learning-rate schedule,
    the Trainer's logged loss reported where ``kubectl get tj`` and the dashboard show it, the
    end of the worker's share of steps, and, when training ends, the parameter server's final
    model loaded into the Trainer's model (``foresight.finish``). ``evaluate``, if given, returns
    the held-out (loss, accuracy) of that final model for the run's summary."""

    def __init__(self, evaluate: Callable[[], tuple[float, float]] | None = None) -> None:
        self.evaluate = evaluate
        self.optimizer: foresight.torch.Optimizer | None = None
        self.total_steps: int | None = None

    def on_train_begin(self, args, state, control, optimizer=None, train_dataloader=None, **kwargs):  # type: ignore[no-untyped-def]
        self.optimizer = _foresight_optimizer(optimizer)
        # The Trainer attaches its own scheduler to every optimizer; the PS's rate is the one applied.
        self.optimizer._scheduler_allowed = True
        foresight.log.info(
            "foresight: the Trainer's learning_rate and lr_scheduler_type are not applied; the parameter "
            "server applies the job's training.learningRate and schedule"
        )
        job = foresight.job()
        try:
            batches = len(train_dataloader) if train_dataloader is not None else None
        except TypeError:  # an IterableDataset has no length: no epochs to count
            batches = None
        if batches is not None:
            steps = max(batches // args.gradient_accumulation_steps, 1)
            job.steps_per_epoch = job.steps_per_epoch or steps
            self.total_steps = job.epochs * job.steps_per_epoch
        return control

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        opt = self.optimizer
        # The job was finalized (the other workers finished it), or this worker's share of steps,
        # counting a replaced process's earlier ones, is in the model.
        if opt is not None and (opt.finished or (self.total_steps and foresight.job().step >= self.total_steps)):
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.optimizer is not None and logs and "loss" in logs:
            foresight.report(loss=float(logs["loss"]), epoch=state.epoch)
        return control

    def on_train_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.optimizer is not None:
            foresight.finish(evaluate=self.evaluate)
        return control
