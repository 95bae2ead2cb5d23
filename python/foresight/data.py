"""``torch.utils.data`` for a Foresight worker: what ``DistributedSampler`` is to DDP, for a job
whose workers come and go::

    import foresight, foresight.data, foresight.torch

    job = foresight.init()
    sampler = foresight.data.Sampler(train_set, batch_size=job.batch_size)   # before or after the Optimizer
    loader = DataLoader(train_set, batch_size=job.batch_size, sampler=sampler)
    opt = foresight.torch.Optimizer(model)
    for epoch in range(job.epochs):
        for x, y in loader:                          # this worker's shard, resumed
            ...; opt.step()

Each epoch yields this worker's shard of the dataset (``foresight.shard``'s rule, every worker the
same count of examples so that ``sync`` rounds find every worker), shuffled anew with the job's
seed. The sampler tells the Optimizer how many steps an epoch has, so the parameter server's
learning-rate schedule (``lrDecay``, ``lrWarmupEpochs``) counts epochs whatever loop the script
has. A replaced worker process resumes: its first epoch starts at the batch after the last step
its earlier process put in the model, and once the job's epochs are done the sampler yields
nothing, so the script's own ``for epoch in range(job.epochs)`` loop needs no change.
"""

from __future__ import annotations

import math
import random
from typing import Any, Iterator, Sized

import torch.utils.data

import foresight

__all__ = ["BatchSampler", "Sampler"]


class Sampler(torch.utils.data.Sampler[int]):
    """This worker's example indices of a dataset of ``len(data_source)`` examples (or of
    ``data_source`` examples when it is an int), an epoch per iteration.

    ``batch_size`` must be the DataLoader's (it defaults to the job's ``training.batchSize``) and
    ``drop_last`` likewise: together they give the steps of an epoch. ``set_epoch`` is accepted
    for ``DistributedSampler`` scripts and changes nothing: the epoch comes from the steps the
    parameter server holds, so a replaced process does not repeat its predecessor's epochs."""

    def __init__(
        self,
        data_source: Sized | int,
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        job = foresight.job()
        n = data_source if isinstance(data_source, int) else len(data_source)
        self.batch_size = batch_size or job.batch_size
        if self.batch_size < 1:
            raise foresight.ConfigError(f"batch_size={self.batch_size} must be at least 1")
        self.shuffle = shuffle
        self.drop_last = drop_last
        # Every worker the same count, as foresight.batches and the Rust worker cut them.
        self.examples = foresight.shard(n)[: n // job.workers]
        batches = len(self.examples) / self.batch_size
        self.steps_per_epoch = math.floor(batches) if drop_last else math.ceil(batches)
        if self.steps_per_epoch == 0:
            raise foresight.ConfigError(
                f"worker {job.worker}'s share of {n} examples ({len(self.examples)}) makes no batch of {self.batch_size}"
            )
        job.steps_per_epoch = self.steps_per_epoch
        # The epoch the next iteration yields; known at the first one, once the worker joined.
        self._epoch: int | None = None

    def __len__(self) -> int:
        """Examples in a whole epoch (the DataLoader's ``len`` divides it by its batch size)."""
        usable = self.steps_per_epoch * self.batch_size
        return min(usable, len(self.examples))

    def set_epoch(self, epoch: int) -> None:
        """Accepted for ``DistributedSampler`` scripts; the epoch comes from the job's steps."""

    @property
    def epoch(self) -> int | None:
        """The epoch the next iteration yields (``None`` before the first)."""
        return self._epoch

    def _order(self, epoch: int) -> list[int]:
        job = foresight.job()
        order = list(self.examples)
        if self.shuffle:
            # A seed per (job seed, worker, epoch): a resumed process draws the orders its
            # predecessor drew without replaying the epochs before.
            random.Random(f"{job.seed}/{job.worker}/{epoch}").shuffle(order)
        return order[: len(self)]

    def __iter__(self) -> Iterator[int]:
        job = foresight.job()
        skip = 0
        if self._epoch is None:
            done = job.step if job.native is not None else 0
            self._epoch, skip = divmod(done, self.steps_per_epoch)
        epoch = self._epoch
        if epoch >= job.epochs:
            return
        self._epoch = epoch + 1
        order = self._order(epoch)
        for b in range(skip, self.steps_per_epoch):
            if job.optimizer is not None and job.optimizer.finished:
                return  # the job was finalized: further batches would be thrown away
            yield from order[b * self.batch_size : (b + 1) * self.batch_size]


class BatchSampler(torch.utils.data.Sampler[list[int]]):
    """:class:`Sampler`'s indices in batches, for ``DataLoader(dataset, batch_sampler=...)``: the
    batch size and ``drop_last`` are given once, here."""

    def __init__(self, data_source: Sized | int, batch_size: int | None = None, **options: Any) -> None:
        self.sampler = Sampler(data_source, batch_size, **options)

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.sampler.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch
