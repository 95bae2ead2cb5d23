"""Foresight: turn an ordinary PyTorch training loop into a worker of a Foresight job.

The parameter server applies every worker's gradients as they arrive, with delay compensation
(DC-ASGD) or the job's other rule; a worker can join, leave or be replaced at any step::

    import foresight, foresight.torch

    job = foresight.init()                         # what the operator / `foresight run` injected
    model = Net()
    opt = foresight.torch.Optimizer(model)         # registers the model (first worker) and joins
    for epoch, idx in foresight.batches(len(train_x)):   # this worker's shard, resumed
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()                                 # push the gradient, pull the new model
    foresight.finish()                             # the PS's final model, in `model`

The protocol (HTTP/2, join / resume, retries, re-seeding a restarted PS) is the Rust client's,
the same code as the Rust worker's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import _native
from .errors import ConfigError, ForesightError, RefusedError, UnreachableError

__all__ = [
    "ConfigError",
    "EXIT_PERMANENT",
    "ForesightError",
    "GRAD_DTYPES",
    "Job",
    "PULL_DTYPES",
    "RefusedError",
    "UnreachableError",
    "batches",
    "finish",
    "init",
    "job",
    "report",
    "resume_step",
    "shard",
    "split",
    "worker",
]

#: The package's version; the parameter server it talks to speaks the same protocol version.
__version__: str = _native.__version__

#: Where the package and its Rust client log (retries, dropped gradients, the final model):
#: configure it as any logger (``logging.basicConfig(level=logging.INFO)`` shows everything).
#: ``$FORESIGHT_LOG`` filters the client's records at the source, as ``RUST_LOG`` does.
log = logging.getLogger("foresight")

#: The types a gradient may travel in (``$FORESIGHT_GRAD_DTYPE``, ``Optimizer(grad_dtype=)``).
GRAD_DTYPES = ("f32", "bf16", "int8")

#: The types the model may be pulled in (``$FORESIGHT_PULL_DTYPE``, ``Optimizer(pull_dtype=)``).
PULL_DTYPES = ("f32", "bf16", "int8")

#: The exit status a worker ends with after a failure no retry can fix; the operator's
#: podFailurePolicy and `foresight run` fail the job at once instead of restarting it.
EXIT_PERMANENT = 3


def _inner_optimizer() -> str:
    name = os.environ.get("FORESIGHT_INNER_OPTIMIZER") or "adamw"
    if name not in ("sgd", "adamw"):
        raise ConfigError(f"$FORESIGHT_INNER_OPTIMIZER={name!r}: expected sgd or adamw")
    return name


def _env_float(name: str, default: float, minimum: float, *, exclusive: bool = False) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
        raise ConfigError(f"${name}={value} must be {'above' if exclusive else 'at least'} {minimum}")
    return value


def _env_int(name: str, default: int | None, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"${name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"${name}={value} must be at least {minimum}")
    return value


def _env_flag(name: str) -> bool:
    raw = os.environ.get(name, "0")
    if raw not in ("0", "1"):
        raise ConfigError(f"${name}={raw!r}: expected 0 or 1")
    return raw == "1"


def _token() -> str | None:
    token = os.environ.get("FORESIGHT_TOKEN")
    path = os.environ.get("FORESIGHT_TOKEN_FILE")
    if token:
        return token
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise ConfigError(f"$FORESIGHT_TOKEN_FILE: cannot read {path}: {e.strerror}") from None
    return None


@dataclass
class Job:
    """This worker's place in the job, from the environment; the rest from the PS at join."""

    ps_url: str
    worker: int
    epochs: int
    batch_size: int
    seed: int
    pull_every: int
    push_every: int
    #: ``$FORESIGHT_GRAD_DTYPE``: the type gradients (or pseudo-gradients) travel in: f32, bf16
    #: or int8 (a scale per 1,024 values, with error feedback).
    grad_dtype: str
    deadline_seconds: float
    report_every: int
    #: ``$FORESIGHT_PULL_DTYPE``: the type the model is pulled in: f32, bf16 (half the bytes;
    #: the worker computes on the model rounded to bf16) or int8 (a quarter: the difference from
    #: the worker's copy, which the PS tracks). The PS keeps float32.
    pull_dtype: str = "f32"
    #: ``optimizer.localSteps``: steps trained with the worker's own inner optimizer between
    #: exchanges (1: every step's gradient is pushed).
    local_steps: int = 1
    #: ``optimizer.innerOptimizer``: the local steps' optimizer when the script passes none.
    inner_optimizer: str = "adamw"
    inner_learning_rate: float = 0.001
    inner_weight_decay: float = 0.0
    #: Intra-op threads for torch (``foresight run`` shares the cores among its workers).
    torch_threads: int = 0
    #: ``$FORESIGHT_SLOWDOWN`` (``foresight run --slow-worker W=F``): after each step the worker
    #: sleeps (F − 1) × the step's time, a straggler for experiments, as the Rust worker does.
    slowdown: float = 1.0
    #: ``$FORESIGHT_ALGORITHM``: the parameter server's update rule (``sync`` waits for rounds).
    algorithm: str = "dc-asgd-a"
    #: ``$FORESIGHT_OVERLAP`` (``1`` or ``0``): the Optimizer's default for ``overlap=``.
    overlap: bool = False
    token: str | None = field(default=None, repr=False)
    #: ``$FORESIGHT_PS_CA_FILE``: PEM certificates trusted for an ``https://`` PS (in a cluster,
    #: the job's certificate, which the operator mounts).
    ps_ca_file: str | None = None
    #: Set when the worker joins (``foresight.torch.Optimizer``).
    native: Any = field(default=None, repr=False)
    #: The ``foresight.torch.Optimizer`` that joined (it loads the final model).
    optimizer: Any = field(default=None, repr=False)
    #: Steps per epoch, once known (``batches``, ``foresight.data.Sampler`` or the Optimizer's
    #: argument): the epochs the parameter server's learning-rate schedule counts.
    steps_per_epoch: int | None = None
    #: The job's worker count asked of the parameter server before the Optimizer joined (a
    #: script that shards its data first), to compare with the count at join.
    workers_before_join: int | None = field(default=None, repr=False)
    started: float = field(default_factory=time.monotonic, repr=False)
    #: What :func:`finish` returned, once it ran.
    done: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> "Job":
        missing = [v for v in ("FORESIGHT_PS_URL", "FORESIGHT_WORKER_INDEX") if not os.environ.get(v)]
        if missing:
            raise ConfigError(
                f"not inside a Foresight job: {' and '.join('$' + v for v in missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set. Run the script as a TrainingJob's "
                "workers (spec.workers.command) or with `foresight run job.yaml`, or set them yourself "
                "(FORESIGHT_PS_URL=http://host:port, or the shards' URLs separated by commas, "
                "FORESIGHT_WORKER_INDEX=0, FORESIGHT_TOKEN=...)."
            )
        dtype = os.environ.get("FORESIGHT_GRAD_DTYPE", "f32")
        if dtype not in GRAD_DTYPES:
            raise ConfigError(f"$FORESIGHT_GRAD_DTYPE={dtype!r}: expected f32, bf16 or int8")
        pull_dtype = os.environ.get("FORESIGHT_PULL_DTYPE", "f32")
        if pull_dtype not in PULL_DTYPES:
            raise ConfigError(f"$FORESIGHT_PULL_DTYPE={pull_dtype!r}: expected f32, bf16 or int8")
        return cls(
            ps_url=os.environ["FORESIGHT_PS_URL"],
            worker=_env_int("FORESIGHT_WORKER_INDEX", None, 0),
            epochs=_env_int("FORESIGHT_EPOCHS", 1, 1),
            batch_size=_env_int("FORESIGHT_BATCH_SIZE", 64, 1),
            seed=_env_int("FORESIGHT_SEED", 1, 0),
            pull_every=_env_int("FORESIGHT_PULL_EVERY", 1, 1),
            push_every=_env_int("FORESIGHT_PUSH_EVERY", 1, 1),
            local_steps=_env_int("FORESIGHT_LOCAL_STEPS", 1, 1),
            inner_optimizer=_inner_optimizer(),
            inner_learning_rate=_env_float("FORESIGHT_INNER_LEARNING_RATE", 0.001, 0.0, exclusive=True),
            inner_weight_decay=_env_float("FORESIGHT_INNER_WEIGHT_DECAY", 0.0, 0.0),
            grad_dtype=dtype,
            pull_dtype=pull_dtype,
            deadline_seconds=float(_env_int("FORESIGHT_PS_DEADLINE_SECONDS", 300, 0)),
            report_every=_env_int("FORESIGHT_REPORT_EVERY", 20, 1),
            torch_threads=_env_int("FORESIGHT_TORCH_THREADS", 0, 0),
            slowdown=_env_float("FORESIGHT_SLOWDOWN", 1.0, 1.0),
            algorithm=os.environ.get("FORESIGHT_ALGORITHM") or "dc-asgd-a",
            overlap=_env_flag("FORESIGHT_OVERLAP"),
            token=_token(),
            ps_ca_file=os.environ.get("FORESIGHT_PS_CA_FILE") or None,
        )

    def joined(self) -> Any:
        if self.native is None:
            raise ForesightError(
                "this worker has not joined yet: create foresight.torch.Optimizer(model) first "
                "(the job's worker count and the resume step come from the parameter server at join)"
            )
        return self.native

    @property
    def workers(self) -> int:
        """The job's worker count: the parameter server's when this worker joined; before that
        (a script building its data loaders, ``shard`` or ``foresight.data.Sampler``, before
        its Optimizer), the parameter server's now, asked once."""
        if self.native is not None:
            return int(self.native.workers)
        if self.workers_before_join is None:
            self.workers_before_join = int(
                _native.job_workers(self.ps_url, self.token, self.deadline_seconds, self.ps_ca_file)
            )
        return self.workers_before_join

    @property
    def step(self) -> int:
        """Steps of this worker in the model so far."""
        return int(self.joined().step)

    def epoch_at(self, step: int) -> float | None:
        return step / self.steps_per_epoch if self.steps_per_epoch else None


_job: Job | None = None


def init() -> Job:
    """Reads the job's settings from the environment the operator and ``foresight run`` inject.

    Raises :class:`ConfigError` naming what is missing outside a job. Idempotent. From here on, an
    uncaught :class:`ForesightError` that no retry can fix ends the process with status 3, which
    fails the job at once instead of restarting the worker.
    """
    global _job
    if _job is None:
        _job = Job.from_env()
        _install_exit_status()
        _exit_on_sigterm()
    return _job


def job() -> Job:
    """The job :func:`init` read (calling it if needed)."""
    return init()


def _install_exit_status() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):  # type: ignore[no-untyped-def]
        previous(kind, value, tb)
        if isinstance(value, ForesightError) and value.permanent:
            # The script's atexit handlers (logging's flush, wandb, TensorBoard writers) run as on
            # any exit; then the status that fails the job instead of restarting the worker.
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_PERMANENT)

    sys.excepthook = hook


def _exit_on_sigterm() -> None:
    """Ends the process on SIGTERM (status 143), as the default action would: a script that is
    PID 1 of its container (``workers.command`` replaces the entrypoint) has no default action,
    so without a handler the kubelet's SIGTERM was ignored and a deleted or preempted worker
    trained on for the whole grace period. A handler the script installed itself stays."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def split(n_examples: int, holdout: float | None = None) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of a dataset without a test split of its own, held out as the
    Rust worker holds out a CSV dataset (``holdout`` defaults to the job's ``dataset.holdout``),
    so that every worker of the job, Rust or Python, trains on the same examples."""
    j = job()
    fraction = holdout if holdout is not None else _env_float("FORESIGHT_HOLDOUT", 0.2, 0.0, exclusive=True)
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"holding out {fraction} of the examples: a fraction between 0 and 1 is needed")
    train, test = _native.holdout_split(n_examples, fraction, j.seed)
    return list(train), list(test)


def shard(n_examples: int) -> list[int]:
    """This worker's examples out of ``n_examples``: the Rust worker's rule (a seeded shuffle,
    then every M-th), so the job's workers, Rust or Python, train on disjoint shards."""
    j = job()
    return list(_native.shard_indices(n_examples, j.worker, j.workers, j.seed))


def batches(n_examples: int, batch_size: int | None = None) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, example indices)`` of every batch this worker trains, over the job's epochs,
    starting after the steps already in the model (a replaced worker resumes where its earlier
    process stopped). Every worker takes the same number of steps per epoch, as the Rust worker
    does, so ``sync`` rounds always find all of them."""
    j = job()
    batch = batch_size or j.batch_size
    mine = shard(n_examples)
    steps = int(_native.steps_per_epoch(n_examples, j.workers, batch))
    if steps == 0:
        raise ForesightError(f"worker {j.worker}'s share of {n_examples} examples is empty")
    j.steps_per_epoch = steps
    per_worker = n_examples // j.workers
    first_epoch, first_batch = divmod(j.step, steps)
    rng = random.Random(j.seed * 1_000_003 + j.worker)
    for epoch in range(j.epochs):
        order = list(mine)
        # Drawn for skipped epochs too, so a resumed process sees the orders its predecessor saw.
        rng.shuffle(order)
        if epoch < first_epoch:
            continue
        order = order[:per_worker]
        skip = first_batch if epoch == first_epoch else 0
        for b in range(skip, steps):
            if j.optimizer is not None and j.optimizer.finished:
                return  # the job was finalized: the steps left would be thrown away
            yield epoch, order[b * batch : (b + 1) * batch]


def resume_step() -> int:
    """Steps of this worker already in the model when it joined (0 for a first process)."""
    return int(job().joined().resume_step)


def emit(event: dict[str, Any]) -> None:
    """One JSON line on stdout, as the Rust worker prints them (``foresight run`` reads them)."""
    print(json.dumps(event), flush=True)


def report(
    *,
    loss: float,
    accuracy: float | None = None,
    epoch: float | None = None,
    samples_per_second: float | None = None,
) -> None:
    """Reports this worker's progress to the parameter server, where ``foresight run``'s progress
    bar, ``kubectl get tj`` and the dashboard show it. ``accuracy`` is a held-out accuracy (an
    end-of-epoch evaluation); ``epoch`` defaults to the fractional epoch reached."""
    j = job()
    native = j.joined()
    at = epoch if epoch is not None else (j.epoch_at(native.step) or 0.0)
    values = _report_values(loss=loss, accuracy=accuracy, epoch=at, samples_per_second=samples_per_second)
    if values is None:
        return
    loss, accuracy, at, samples_per_second = values
    timed = j.optimizer.clock.phase("report") if j.optimizer is not None else contextlib.nullcontext()
    with timed:
        try:
            native.report(at, loss, accuracy, samples_per_second)
        except ForesightError as e:
            # Telemetry: a PS that is slow to answer or refuses a report does not stop training.
            log.warning("a progress report was not delivered: %s", e)
    _pushes, _discarded, staleness = native.push_stats
    if accuracy is None:
        emit(
            {
                "event": "progress",
                "worker": j.worker,
                "epoch": at,
                "step": native.step,
                "loss": float(loss),
                "samples_per_second": float(samples_per_second or 0.0),
                "staleness": staleness,
            }
        )
    else:
        emit({"event": "eval", "worker": j.worker, "epoch": int(at), "loss": float(loss), "accuracy": accuracy})


def _report_values(
    *, loss: Any, accuracy: Any, epoch: Any, samples_per_second: Any
) -> tuple[float, float | None, float, float | None] | None:
    """The report's values as the parameter server takes them (finite; loss and throughput not
    negative; accuracy a fraction in [0, 1]), or ``None`` when the loss cannot be reported: a
    bad value is dropped with a warning, never raised into the training loop."""

    def number(name: str, value: Any, low: float, high: float) -> float | None:
        if value is None:
            return None
        try:
            v = float(value)
        except (TypeError, ValueError):
            log.warning("report: %s=%r is not a number; dropped", name, value)
            return None
        if not (math.isfinite(v) and low <= v <= high):
            log.warning("report: %s=%s is outside [%s, %s]; dropped (the parameter server takes no other)", name, v, low, high)
            return None
        return v

    reported_loss = number("loss", loss, 0.0, math.inf)
    if reported_loss is None:
        return None
    at = number("epoch", epoch, 0.0, 1e9)
    return (
        reported_loss,
        number("accuracy", accuracy, 0.0, 1.0),
        0.0 if at is None else at,
        number("samples_per_second", samples_per_second, 0.0, math.inf),
    )


def finish(*, evaluate: Callable[[], tuple[float, float]] | None = None) -> dict[str, Any]:
    """Ends this worker's training: the parameter server is told this worker trained all its steps
    (``sync`` rounds stop waiting for it), and the model the Optimizer wraps now holds the
    parameter server's model, the job's result (evaluate that, not this worker's copy). ``evaluate``, called after
    that, returns its held-out (loss, accuracy) for the run's summary (without it the summary
    names no accuracy). Returns this worker's counts: steps, gradients pushed and discarded, and
    the evaluation."""
    j = job()
    if j.optimizer is None:
        j.joined()  # raises: nothing joined
    if j.done is not None:
        return j.done  # finished already (``with foresight.worker(...)`` after a finish())
    # The steps' phases: what runs after the last step (an evaluation, this) is not training.
    phases = dict(j.optimizer.clock.seconds)
    j.optimizer.load_final()
    pushes, discarded, _ = j.joined().push_stats
    done: dict[str, Any] = {
        "event": "done",
        "worker": j.worker,
        "steps": j.step,
        "pushes": pushes,
        "discarded": discarded,
        "seconds": time.monotonic() - j.started,
        "phases": phases,
    }
    if j.joined().was_last:
        # This worker's leave wrote the final model, with its buffers: its evaluation below is
        # of that very model, and the run's summary reports it.
        done["last"] = True
    if evaluate is not None:
        loss, accuracy = evaluate()
        done.update(test_loss=float(loss), test_accuracy=float(accuracy))
    emit(done)
    j.done = done
    return done


@contextlib.contextmanager
def worker(model: Any, **options: Any) -> Iterator[Any]:
    """``with foresight.worker(model) as opt:`` joins the job with
    ``foresight.torch.Optimizer(model, **options)`` and, when the block ends normally, finishes
    (:func:`finish`: the unsent steps pushed, the parameter server told, its final model in
    ``model``). An exception leaves without finishing: the worker did not train all its steps,
    and a replaced process resumes where this one stopped."""
    import foresight.torch

    opt = foresight.torch.Optimizer(model, **options)
    yield opt
    finish()
