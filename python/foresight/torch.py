"""The optimizer-shaped wrapper: ``loss.backward(); opt.step()`` pushes the gradients to the
parameter server and pulls its model into the parameters, as the job's pullEvery / pushEvery say.

The parameter server applies the update (the job's rule: dc-asgd-a, asgd, sync, ...), so there
is no local optimizer. Parameters are matched by ``named_parameters()`` names. Parameters with
``requires_grad=False`` and buffers (BatchNorm statistics) are trained locally, by the forward
passes, not by the server; when the worker finishes they go with it (``finish``), and the last
worker's are written into the final model, which therefore holds the model's whole
``state_dict``: it loads with ``load_state_dict(strict=True)`` and is the model that worker's
``finish(evaluate=...)`` scored.

It is a ``torch.optim.Optimizer``, so what takes one (step hooks, Hugging Face's
``Trainer(optimizers=...)``, see ``foresight.transformers``) takes it; its ``lr`` is 0 and unused:
the parameter server applies the job's ``training.learningRate`` and schedule. A learning-rate
scheduler attached to it would change nothing, so its first step is refused with a
``ConfigError`` (with local steps, schedule the ``inner=`` optimizer instead).

With the job's ``optimizer.localSteps: H`` (low-communication training, DiLoCo) the worker does
have a local optimizer (the job's ``innerOptimizer``, or the user's own ``inner=``): ``step()`` runs it, and every H
steps the pseudo-gradient θ_pulled − θ_local goes to the parameter server, which applies the
job's rule to it as the outer step, and the worker continues from the server's model.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch

import foresight

from . import _native

__all__ = ["Optimizer"]

# The safetensors name of each dtype a buffer may have (what the parameter server keeps).
BUFFER_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}

# The phases of the Rust worker's `done` line (wire::progress::PhaseSeconds), in its order.
PHASES = ("batch", "pull", "load", "compute", "gather", "push", "report", "evaluate", "slowdown")


class PhaseClock:
    """Where a Python worker's training time goes, in the Rust worker's phases: the Optimizer
    times its own parts (pull, load, gather, push, the inner optimizer as compute) and
    ``foresight.report`` its reports; the time between two steps is the script's own (its data
    loading, forward and backward), counted as ``compute`` because the package cannot tell them
    apart; ``slowdown`` is the sleep of a worker slowed on purpose (``$FORESIGHT_SLOWDOWN``).
    ``batch`` and ``evaluate`` stay 0."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._mark = time.perf_counter()
        # Seconds the package's own calls took since the mark (a report between two steps).
        self._timed_since_mark = 0.0
        # When the step now running began (the end of the one before).
        self.step_began = self._mark
        # Pull and push seconds when it began: a slowdown stretches the rest of the step.
        self._network_at_step = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            self.seconds[name] += took
            self._timed_since_mark += took

    def script_ran(self) -> None:
        """At the start of a step: the time since the last mark, less the package's own, was
        the script's."""
        now = time.perf_counter()
        self.seconds["compute"] += max(now - self._mark - self._timed_since_mark, 0.0)
        self._mark, self._timed_since_mark = now, 0.0

    def _network(self) -> float:
        return self.seconds["pull"] + self.seconds["push"]

    def slow_down(self, factor: float) -> None:
        """At the end of a step: with ``factor`` above 1, sleeps (factor − 1) × the step's own
        work (the script's part included, the pull and push left out: a straggler is a slower
        device, not a slower link or a longer wait for a round), as the Rust worker's
        ``--slowdown`` does. Then the next step begins."""
        if factor > 1.0:
            work = time.perf_counter() - self.step_began - (self._network() - self._network_at_step)
            with self.phase("slowdown"):
                time.sleep(max(work, 0.0) * (factor - 1.0))
        self.step_began = time.perf_counter()
        self._network_at_step = self._network()


class Optimizer(torch.optim.Optimizer):
    """A worker's optimizer: ``zero_grad()``, ``step()``, as any ``torch.optim.Optimizer``.

    Creating it joins the job: the first worker's model is registered as the initial model (give
    every worker the same seed), and every worker starts from the parameter server's model.
    ``grad_dtype`` (``"f32"``, ``"bf16"`` or ``"int8"``, default the job's
    ``$FORESIGHT_GRAD_DTYPE``) is the type gradients travel in; the parameter server keeps float32.
    ``"int8"`` sends a scale per 1,024 values and carries each push's rounding error into the
    next (error feedback): a quarter of float32's bytes, for local steps over a slow link.
    ``pull_dtype`` (``"f32"``, ``"bf16"`` or ``"int8"``, default the job's
    ``$FORESIGHT_PULL_DTYPE``) is the type the model is pulled in: ``"bf16"`` halves every pull,
    and the worker computes on the model rounded to bf16, as mixed-precision training computes on
    a bf16 copy of float32 master weights; ``"int8"`` sends the difference from the worker's copy
    (which the parameter server tracks), a quarter of the bytes, each pull's rounding carried into
    the next.
    ``steps_per_epoch`` drives the job's learning-rate schedule (``foresight.batches`` sets it).

    With the job's ``optimizer.localSteps`` above 1, the local steps are trained by ``inner``, an
    optimizer over the same parameters, or when it is ``None`` by the job's
    ``optimizer.innerOptimizer`` (AdamW at 0.001 by default); its state (AdamW's moments) carries
    over from one exchange to the next, as in DiLoCo. With ``localSteps: 1`` an ``inner``
    optimizer (Adam, say) makes every step's change of the model the pushed update: the
    parameter server applies the job's rule to it (``asgd`` at learning rate 1 adds it as it is),
    asynchronous training with the user's own optimizer.

    ``overlap=True`` (default ``$FORESIGHT_OVERLAP``) overlaps communication with computation:
    ``step()`` hands the gradient to a background exchange (push, then pull) and returns, and the
    next step computes while it runs; the model it pulls is loaded at the step after, so each
    gradient is computed on the model pulled one exchange earlier, one update staler. Its push
    says which model that was, and a delay-compensated rule compensates against exactly that
    one (the parameter server keeps the worker's last two pulls). Refused with ``sync`` and with
    an inner optimizer (local steps, or ``inner=``). A ``foresight.report`` between two steps
    waits for the exchange in flight.

    ``torch.compile``'s and ``DataParallel``'s wrappers are seen through: names are the module's
    own. A learning-rate scheduler on this Optimizer, further parameter groups (per-group
    weight decay and rates are the job's ``optimizer.parameterGroups``) and sparse gradients are
    refused with :class:`foresight.ConfigError`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        grad_dtype: str | None = None,
        pull_dtype: str | None = None,
        steps_per_epoch: int | None = None,
        inner: torch.optim.Optimizer | None = None,
        overlap: bool | None = None,
    ) -> None:
        job = foresight.init()
        overlap = job.overlap if overlap is None else overlap
        if overlap and (inner is not None or job.local_steps > 1):
            raise foresight.ConfigError(
                "overlap=True pushes each step's gradient while the next step computes: not with an inner "
                "optimizer (optimizer.localSteps above 1, or inner=), whose update is taken against the model "
                "it started from"
            )
        if overlap and job.algorithm == "sync":
            raise foresight.ConfigError(
                "overlap=True computes each gradient on the model pulled one exchange earlier, which a sync "
                "round (optimizer.algorithm sync) refuses as stale: leave overlap off or use an asynchronous rule"
            )
        if job.local_steps == 1 and inner is not None and (job.push_every, job.pull_every) != (1, 1):
            raise foresight.ConfigError(
                "inner= with optimizer.localSteps 1 sends each step's change of the model, which pushEvery and "
                "pullEvery above 1 would average or skip: leave them at 1, or use localSteps"
            )
        if job.torch_threads:
            torch.set_num_threads(job.torch_threads)
        if job.optimizer is not None:
            raise foresight.ForesightError("this process already joined the job with another Optimizer")
        model = _unwrapped(model)
        # Sorted by name, as the Rust worker's built-in models are: a Python and a Rust worker
        # of the same architecture exchange the same layout.
        named = sorted(((n, p) for n, p in model.named_parameters() if p.requires_grad), key=lambda t: t[0])
        if not named:
            raise foresight.ConfigError("the model has no parameter that requires a gradient")
        _refuse_sparse(model)
        _check_untrained_dtypes(model, {n for n, _ in named})
        devices = {p.device for _, p in named}
        if len(devices) != 1:
            raise foresight.ConfigError(f"the model's parameters are on several devices ({sorted(map(str, devices))})")
        if grad_dtype is not None and grad_dtype not in foresight.GRAD_DTYPES:
            raise foresight.ConfigError(f"grad_dtype={grad_dtype!r}: expected 'f32', 'bf16' or 'int8'")
        if pull_dtype is not None and pull_dtype not in foresight.PULL_DTYPES:
            raise foresight.ConfigError(f"pull_dtype={pull_dtype!r}: expected 'f32', 'bf16' or 'int8'")
        self._building = True
        super().__init__([p for _, p in named], {"lr": 0.0})
        self._building = False
        self.model = model
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._numel = sum(p.numel() for p in self._params)
        # Host buffers the Rust client reads and writes in place: one copy each way per exchange.
        # Pinned once the model is on a GPU (_pin_for_the_device: a Trainer moves it later).
        self._grad = torch.zeros(self._numel, dtype=torch.float32)
        self._flat = torch.empty(self._numel, dtype=torch.float32)
        # The last host-to-device copy out of _flat, which must end before _flat is written again.
        self._loaded: Any = None
        self._pin_for_the_device()
        if steps_per_epoch is not None:
            job.steps_per_epoch = steps_per_epoch
        with torch.no_grad():
            self._flat.copy_(torch.cat([p.detach().reshape(-1).float() for p in self._params]))
        self._job = job
        self._native = _native.Worker(
            job.ps_url,
            job.token,
            job.worker,
            [n for n, _ in named],
            [list(p.shape) for _, p in named],
            self._flat.data_ptr(),
            self._flat,
            job.pull_every,
            job.push_every,
            grad_dtype or job.grad_dtype,
            job.deadline_seconds,
            job.seed,
            job.local_steps,
            job.ps_ca_file,
            pull_dtype or job.pull_dtype,
            overlap,
            job.algorithm == "sync",
        )
        self._inner = inner if inner is not None or job.local_steps == 1 else self._job_inner(job)
        job.native = self._native
        job.optimizer = self
        if job.workers_before_join not in (None, self._native.workers):
            foresight.log.warning(
                "foresight: the job was scaled from %d to %d workers between the script's shard() and its join: "
                "this process's data shard is by the count before; a restarted process shards by the new one",
                job.workers_before_join,
                self._native.workers,
            )
        self.finished = False
        self.overlap = overlap
        # Where each parameter's gradient sits in _grad, and its values in _flat, when they are
        # views into them.
        self._grad_addrs: list[int] | None = None
        self._grads_into_flat_buffer()
        self._param_addrs: list[int] | None = None
        self._params_into_flat_buffer()
        # Overlapped: the version the last exchange pulled into _flat, not yet loaded.
        self._pulled: int | None = None
        # Set by foresight.transformers' callback: the Trainer always attaches a scheduler.
        self._scheduler_allowed = False
        self._warned_no_epoch = False
        self.clock = PhaseClock()
        if self._native.resume_step > 0:
            # As the Rust worker logs it: a replaced worker's log says where it picked up.
            print(
                f"foresight: worker {job.worker} resuming where this worker's earlier process left off "
                f"(step {self._native.resume_step} of its steps already in the model)",
                file=sys.stderr,
                flush=True,
            )
        self._pull()
        if overlap:
            self._native.mark_loaded()  # the first step computes on the model just pulled
        self.clock = PhaseClock()  # the join and the first pull are set-up, not training

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused after construction: the parameter server trains the model's parameters as
        registered; added parameters would never be trained. Per-group weight decay and rates
        are the job's ``optimizer.parameterGroups`` (tensors chosen by name, applied by the
        parameter server), or, with local steps, the ``inner=`` optimizer's own groups."""
        if not getattr(self, "_building", True):
            raise foresight.ConfigError(
                "foresight.torch.Optimizer trains every parameter of the model it was built with; it takes no "
                "further parameter groups: set per-group weight decay and learning rates in the job's "
                "optimizer.parameterGroups (e.g. [{names: ['bias$', 'norm'], weightDecay: 0}]), which the "
                "parameter server applies by tensor name"
            )
        super().add_param_group(param_group)

    @property
    def device(self) -> torch.device:
        """Where the parameters are now (a Trainer may move the model after this was created)."""
        return self._params[0].device

    @property
    def local_steps(self) -> int | None:
        """With local steps, how many this worker trains before its next exchange: the job's
        ``optimizer.localSteps``, or what the parameter server told it last
        (``optimizer.adaptiveLocalSteps``). ``None`` when every step's gradient is sent."""
        return self._native.local_steps

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Ends the step: sends its gradient (every pushEvery steps, their mean) and takes the
        parameter server's model (every pullEvery steps); with local steps, runs the inner
        optimizer and every localSteps steps sends the pseudo-gradient and takes the server's
        model. After the job was finalized, does nothing and sets ``finished``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.finished:
            return loss
        self._refuse_a_scheduler()
        clock = self.clock
        clock.script_ran()
        if self.overlap:
            self._end_exchange()  # the one this step computed beside
            if self.finished:
                return loss
        self._pin_for_the_device()
        job = self._job
        epoch = job.epoch_at(self._native.step + 1)
        if epoch is None and not self._warned_no_epoch:
            self._warned_no_epoch = True
            foresight.log.warning(
                "foresight: the steps per epoch are unknown, so the parameter server sees no epochs and "
                "the job's learning-rate schedule (lrDecay milestones, lrWarmupEpochs) cannot advance: "
                "iterate foresight.batches(), give the DataLoader a foresight.data.Sampler, or pass "
                "Optimizer(model, steps_per_epoch=...)"
            )
        if self._inner is not None:
            with clock.phase("compute"):
                self._inner.step()
        if self.overlap:
            self._overlapped_exchange(epoch, loss)
            clock.slow_down(job.slowdown)
            return loss
        if self._inner is not None and not self._native.push_due_next:
            with clock.phase("push"):
                self._native.end_local_step(epoch)  # a local step: nothing is sent
        else:
            with clock.phase("gather"):
                if self._inner is not None:
                    self._pseudo_gradient()
                else:
                    self._gather()
            with clock.phase("push"):
                self.finished = self._native.end_step(self._grad.data_ptr(), self._numel, epoch, self._grad)
            if not self.finished:
                self._pull()
        if job.report_every and self._native.step % job.report_every == 0 and loss is not None:
            foresight.report(loss=float(loss))
        clock.slow_down(job.slowdown)
        return loss

    def _overlapped_exchange(self, epoch: float | None, loss: torch.Tensor | None) -> None:
        """Sends this step's gradient in the background: the model the last exchange pulled is
        loaded first (this step's gradient was computed on the one before it, which the push
        names), then the exchange pushes and pulls while the script computes the next step."""
        job, clock = self._job, self.clock
        with clock.phase("gather"):
            self._gather()
        loaded = self._pulled is not None
        if loaded:
            with clock.phase("load"):
                self._load()
            self._pulled = None
        if job.report_every and (self._native.step + 1) % job.report_every == 0 and loss is not None:
            foresight.report(loss=float(loss))  # before the exchange takes the client
        self._flat_is_free()
        with clock.phase("push"):
            self._native.begin_exchange(
                self._grad.data_ptr(), self._flat.data_ptr(), self._numel, loaded, epoch, self._grad
            )

    def _end_exchange(self) -> None:
        """Waits for the exchange in flight, if any (counted as push time: the step waits on the
        network only for what the computation did not cover)."""
        with self.clock.phase("push"):
            done = self._native.end_exchange()
        if done is not None:
            self.finished, self._pulled = done

    def _refuse_a_scheduler(self) -> None:
        """A learning-rate scheduler writes ``initial_lr`` into the groups it drives; on this
        Optimizer it would change nothing (the parameter server applies the job's rate)."""
        if not self._scheduler_allowed and any("initial_lr" in g for g in self.param_groups):
            raise foresight.ConfigError(
                "a learning-rate scheduler is attached to foresight.torch.Optimizer, whose lr is not used: the "
                "parameter server applies the job's training.learningRate with its lrDecay and lrWarmupEpochs. "
                "Set the schedule in the TrainingJob, or, with optimizer.localSteps above 1, attach the "
                "scheduler to the inner= optimizer"
            )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``, except that gradients which are views into
        the flat gradient buffer (``_grads_into_flat_buffer``) are zeroed in place and kept."""
        if self._grads_are_views():
            self._grad.zero_()
        else:
            super().zero_grad(set_to_none=set_to_none)

    def _gather(self) -> None:
        if self._grads_are_views():
            return  # backward accumulated into _grad itself
        if any(p.grad is not None and p.grad.is_sparse for p in self._params):
            raise foresight.ConfigError(_SPARSE)
        if self._grad_addrs is not None:
            self._gather_beside_views()
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        if self.device.type == "cpu" and all(g.dtype == torch.float32 for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=self._grad)
        else:
            # One device-side concatenation, then one transfer into the pinned host buffer.
            self._grad.copy_(torch.cat([g.reshape(-1).float() for g in grads]))

    def _gather_beside_views(self) -> None:
        """Gradients some of which are no longer views into _grad (``model.zero_grad()`` set
        them to ``None``, and backward made new ones): made views again, each new one copied
        into its place first (and freed), a missing one zeros."""
        for p, place in self._places(self._grad):
            if p.grad is None:
                place.zero_()
        self._grads_into_flat_buffer()

    def _places(self, flat: torch.Tensor) -> Iterator[tuple[torch.nn.Parameter, torch.Tensor]]:
        """Each parameter with its place in ``flat`` (in layout order), shaped as the parameter."""
        offset = 0
        for p in self._params:
            n = p.numel()
            yield p, flat[offset : offset + n].view_as(p)
            offset += n

    def _views_allowed(self) -> bool:
        """Whether the parameters and their gradients may be views into _flat and _grad: on the
        CPU, for contiguous float32 parameters, when every step's gradient is pushed as it is and
        the pulled model is what the next step computes on. An inner optimizer reads ``.grad``
        itself (zeros are not ``None`` to AdamW) and takes its pseudo-gradient against _flat, and
        an overlapped exchange writes _flat and reads _grad while the next step computes."""
        cpu_f32 = all(p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous() for p in self._params)
        return cpu_f32 and self._inner is None and not self.overlap

    def _grads_into_flat_buffer(self) -> None:
        """Makes each parameter's ``.grad`` a view into _grad, as DDP's
        ``gradient_as_bucket_view`` does: backward then accumulates straight into the buffer the
        client pushes, and the model's gradients take no memory of their own (4 bytes per
        parameter less, and no concatenation per step). A gradient that is not its view yet is
        copied into place first. Only where ``_views_allowed``."""
        if not self._views_allowed():
            self._grad_addrs = None
            return
        addrs = []
        with torch.no_grad():
            for p, view in self._places(self._grad):
                if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad)
                p.grad = view
                addrs.append(view.data_ptr())
        self._grad_addrs = addrs

    def _params_into_flat_buffer(self) -> None:
        """Makes each parameter's values a view into _flat, which holds the model pulled last
        (as FSDP's flat parameter does): the client pulls straight into the parameters, so there
        is no copy per pull and the parameters take no memory of their own (4 bytes per parameter
        less). _flat holds their values when this is called (the initial model, or a pull). Only
        where ``_views_allowed``."""
        if not self._views_allowed():
            self._param_addrs = None
            return
        addrs = []
        with torch.no_grad():
            for p, view in self._places(self._flat):
                p.data = view
                addrs.append(p.data_ptr())
        self._param_addrs = addrs

    def _params_are_views(self) -> bool:
        """Whether every parameter's values are still its view into _flat (``model.to(...)`` or
        a Trainer replaces them)."""
        addrs = self._param_addrs
        return addrs is not None and all(p.data_ptr() == a for p, a in zip(self._params, addrs))

    def _grads_are_views(self) -> bool:
        """Whether every gradient is still its view into _grad (``model.zero_grad()`` sets them
        to ``None``; a Trainer may have moved the model to a GPU)."""
        addrs = getattr(self, "_grad_addrs", None)
        return addrs is not None and all(
            p.grad is not None and p.grad.data_ptr() == a for p, a in zip(self._params, addrs)
        )

    def _job_inner(self, job: foresight.Job) -> torch.optim.Optimizer:
        """The job's ``optimizer.innerOptimizer`` (AdamW at 0.001 unless it says otherwise)."""
        rule = torch.optim.AdamW if job.inner_optimizer == "adamw" else torch.optim.SGD
        return rule(self._params, lr=job.inner_learning_rate, weight_decay=job.inner_weight_decay)

    def _pseudo_gradient(self) -> None:
        """θ_pulled − θ_local into the gradient buffer: the model pulled last is still in the
        flat buffer (a pull overwrites it only at the next exchange)."""
        params = [p.detach().reshape(-1) for p in self._params]
        if self.device.type == "cpu" and all(p.dtype == torch.float32 for p in params):
            torch.cat(params, out=self._grad)
        else:
            self._grad.copy_(torch.cat([p.float() for p in params]))
        torch.sub(self._flat, self._grad, out=self._grad)

    def _pin_for_the_device(self) -> None:
        """Page-locked host buffers when the model is on a GPU, so that the copies each way are
        DMA transfers; checked every step because a Trainer (or the script) may move the model
        after the Optimizer was built on the CPU. (Unverified on a GPU here: no GPU was lent.)"""
        if self.device.type == "cuda" and not self._flat.is_pinned():
            self._grad = self._grad.pin_memory()
            self._flat = self._flat.pin_memory()

    def _flat_is_free(self) -> None:
        """Waits for the last load's copy out of the pinned _flat before the client writes it."""
        if self._loaded is not None:
            self._loaded.synchronize()
            self._loaded = None

    def _pull(self) -> None:
        self._flat_is_free()
        with self.clock.phase("pull"):
            pulled = self._native.pull_if_due(self._flat.data_ptr(), self._numel)
        if pulled is not None:
            with self.clock.phase("load"):
                self._load()

    def _load(self) -> None:
        if self._params_are_views():
            return  # the client pulled into the parameters themselves
        if self._views_allowed():
            self._params_into_flat_buffer()  # _flat holds the pulled model: the views are it
            return
        flat = self._flat.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._loaded = torch.cuda.Event()
            self._loaded.record()
        with torch.no_grad():
            for p, place in self._places(flat):
                p.copy_(place)

    def load_final(self) -> None:
        """Ends this worker's training: pushes the steps left over since the last push (fewer
        than pushEvery or localSteps), tells the parameter server this worker trained all its
        steps (``sync`` rounds stop waiting for it), then loads its model (the job's result) into
        the parameters."""
        if self.overlap:
            self._end_exchange()
        pseudo = None
        if self._inner is not None and self._native.steps_unsent > 0:
            # Local steps since the last exchange: their pseudo-gradient goes with the finish.
            self._pseudo_gradient()
            pseudo = self._grad.data_ptr()
        buffers, aliases = _untrained_state(self.model, set(self._names))
        self._flat_is_free()
        self._native.finish(self._flat.data_ptr(), self._numel, pseudo, buffers, aliases)
        self.finished = True
        self._load()

    def __enter__(self) -> "Optimizer":
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        """``with foresight.torch.Optimizer(model) as opt:`` finishes when the block ends normally;
        after an exception it leaves without finishing (a replaced process resumes)."""
        if kind is None:
            foresight.finish()

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        return iter(self._params)


_SPARSE = (
    "sparse gradients (nn.Embedding(sparse=True), nn.EmbeddingBag(sparse=True)) cannot be sent to the "
    "parameter server, which keeps the model dense: build the layer with sparse=False"
)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside ``torch.compile``'s and (Distributed)DataParallel's
    wrappers, which prefix every name (``_orig_mod.``, ``module.``): the layout, the final
    model's names and a Rust worker's must be the module's own. The parameters are the same
    objects either way."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if inner is None and isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            inner = model.module
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _refuse_sparse(model: torch.nn.Module) -> None:
    for name, module in model.named_modules():
        if getattr(module, "sparse", False) is True:
            raise foresight.ConfigError(f"{name or 'the model'}: {_SPARSE}")


def _check_untrained_dtypes(model: torch.nn.Module, trained: set[str]) -> None:
    """Refuses, at the start rather than at the end, a buffer the final model cannot keep."""
    for name, value in model.state_dict(keep_vars=True).items():
        if name not in trained and isinstance(value, torch.Tensor) and value.dtype not in BUFFER_DTYPES:
            raise foresight.ConfigError(
                f"state_dict entry {name!r} is {value.dtype}: the final model keeps "
                f"{', '.join(str(d).removeprefix('torch.') for d in BUFFER_DTYPES)}"
            )


def _untrained_state(
    model: torch.nn.Module, trained: set[str]
) -> tuple[list[tuple[str, str, list[int], bytes]], dict[str, str]]:
    """The entries of ``model.state_dict()`` the parameter server does not train, for the final
    model: buffers and frozen parameters as (name, safetensors dtype, shape, bytes), and the
    second names of tied trained parameters (``lm_head.weight`` → ``embed.weight``), whose
    values are the server's."""
    by_identity = {id(p): n for n, p in model.named_parameters() if n in trained}
    buffers: list[tuple[str, str, list[int], bytes]] = []
    aliases: dict[str, str] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if name in trained:
            continue
        if id(value) in by_identity:
            aliases[name] = by_identity[id(value)]
            continue
        if not isinstance(value, torch.Tensor):
            continue  # extra state (get_extra_state) is not a tensor: not in the file
        dtype = BUFFER_DTYPES[value.dtype]  # checked at construction
        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        buffers.append((name, dtype, list(value.shape), flat.numpy().tobytes()))
    return buffers, aliases
