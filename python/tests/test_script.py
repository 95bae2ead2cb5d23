"""What an ordinary PyTorch script does, against a real `foresight-ps` on loopback: its whole
`state_dict` in the final model, its own DataLoader loop, its schedulers, its mistakes, its
Ctrl-C. Each test failed before the change it comes with."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import foresight
import foresight.data
import foresight.torch
from conftest import ROOT, TOKEN
from test_worker import foresight_run, one_step, tiny_model, worker_env


class BatchNormNet(torch.nn.Module):
    """Buffers of three kinds (BatchNorm's float statistics and int64 counter, a registered
    mask), a frozen parameter and a tied one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Linear(4, 4, bias=False)
        self.bn = torch.nn.BatchNorm1d(4)
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(4, 4, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two state_dict names
        self.register_buffer("mask", torch.tensor([True, False, True, True]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.bn(self.embed(x))) * self.mask)


def test_the_final_model_holds_buffers_frozen_and_tied_entries_and_loads_strictly(ps_factory, job_env, tmp_path):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    model = BatchNormNet()
    opt = foresight.torch.Optimizer(model)
    x = torch.randn(16, 4)
    for _ in range(5):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    foresight.finish()
    assert opt.finished
    import safetensors.torch

    saved = safetensors.torch.load_file(str(tmp_path / "output" / "model-final.safetensors"))
    fresh = BatchNormNet()
    fresh.load_state_dict(saved, strict=True)  # raised "Missing key(s)" before
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    assert saved["bn.num_batches_tracked"].dtype == torch.int64 and int(saved["bn.num_batches_tracked"]) == 5
    assert not torch.equal(saved["bn.running_var"], torch.ones(4)), "the statistics the steps trained"
    assert torch.equal(saved["head.weight"], saved["embed.weight"]), "the tied name holds the PS's values"


def test_a_python_jobs_final_model_scores_what_the_summary_says(tmp_path):
    """The DataLoader example (BatchNorm, dropout, foresight.data.Sampler) under `foresight run`:
    its model-final.safetensors, loaded strictly into the script's own Net, scores the summary's
    accuracy on the held-out split, to the example."""
    job = (ROOT / "examples/python/mnist-dataloader.yaml").read_text()
    job = job.replace("epochs: 4", "epochs: 2").replace("replicas: 4", "replicas: 2").replace("[3]", "[1]")
    summary, out = foresight_run(tmp_path, job)
    sys.path.insert(0, str(ROOT / "examples/python"))
    try:
        import mnist_dataloader as example
    finally:
        sys.path.pop(0)
    import safetensors.torch

    model = example.Net()
    model.load_state_dict(safetensors.torch.load_file(str(out / "model-final.safetensors")), strict=True)
    model.to(example.DEVICE)  # where the workers scored it (a GPU's sums may round otherwise)
    test = foresight._native.holdout_split(5000, 0.2, 1)[1]
    x, y = _mnist5k()
    _, accuracy = example.evaluate(model, x[list(test)], y[list(test)])
    print(f"summary {summary['accuracy']:.4f}, the file {accuracy:.4f}")
    assert summary["accuracy"] > 0.85, summary
    assert accuracy == pytest.approx(summary["accuracy"], abs=1e-6)


def _mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    import gzip

    import numpy as np

    with gzip.open(ROOT / "data/mnist5k/mnist_5k.csv.gz", "rt") as f:
        rows = torch.from_numpy(np.loadtxt(f, delimiter=",", dtype=np.float32))
    return rows[:, :784].view(-1, 1, 28, 28) / 255.0, rows[:, 784].long()


def test_the_ps_schedule_counts_the_epochs_of_a_dataloader_loop(ps_factory, job_env):
    """lrDecay at epoch 1 (×0.5): a script whose DataLoader draws from foresight.data.Sampler
    moves the PS's learning rate at the milestone; before, such a script's pushes carried no
    epoch and the rate stayed at η for the whole job."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1, lr_decay_factor=0.5, lr_milestones="1")
    job_env(ps, epochs=2, batch_size=10)
    data = torch.utils.data.TensorDataset(torch.randn(100, 4), torch.zeros(100, dtype=torch.long))
    loader = torch.utils.data.DataLoader(data, batch_size=10, sampler=foresight.data.Sampler(data))
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    rates = []
    for _epoch in range(2):
        for b, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if b == 4:  # the middle of the epoch
                rates.append(ps.status()["learning_rate"])
    assert foresight.job().step == 20
    assert rates == [pytest.approx(0.1), pytest.approx(0.05)]
    for x, _ in loader:
        pytest.fail("the job's epochs are done: the sampler yields nothing more")


def test_a_replaced_process_resumes_its_sampler_at_the_next_batch(ps_factory, job_env):
    ps = ps_factory(workers=2, algorithm="asgd", learning_rate=0.1)
    job_env(ps, worker=1, epochs=2, batch_size=8)
    # Before the Optimizer, as a script builds its loaders: the count comes from the environment.
    first = foresight.data.BatchSampler(100, batch_size=8)
    assert first.sampler.examples == foresight._native.shard_indices(100, 1, 2, 1)[:50]
    assert len(first) == 7
    opt = foresight.torch.Optimizer(tiny_model())
    expected = []  # what the process would have trained next
    for _epoch in range(2):
        for batch in first:  # epoch 0 (7 batches) and two of epoch 1 are trained
            if opt._native.step < 9:
                one_step(opt.model, opt)
            else:
                expected.append(batch)
    assert len(expected) == 5
    job_env(ps, worker=1, epochs=2, batch_size=8)  # a new process of worker 1
    again = foresight.data.BatchSampler(100, batch_size=8)
    foresight.torch.Optimizer(tiny_model())
    assert foresight.resume_step() == 9
    assert list(again) == expected, "the rest of epoch 1, from the batch after the last step"
    assert list(again) == [], "then the job's epochs are done"


def test_a_bad_progress_value_is_dropped_with_a_warning_and_training_goes_on(ps_factory, job_env, caplog):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    with caplog.at_level(logging.WARNING, logger="foresight"):
        foresight.report(loss=float("nan"))  # an fp16 run's overflowed loss: raised before
        foresight.report(loss=-3.5)  # a Gaussian NLL
        foresight.report(loss=0.5, accuracy=97.0)  # a percentage
    messages = [r.getMessage() for r in caplog.records]
    assert any("loss=nan" in m for m in messages) and any("loss=-3.5" in m for m in messages), messages
    assert any("accuracy=97.0" in m for m in messages), messages
    one_step(model, opt)
    assert foresight.job().step == 1
    assert ps.status()["loss"] == pytest.approx(0.5), "the valid loss of the third report"


def test_a_scheduler_on_the_optimizer_is_refused_not_ignored(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with pytest.raises(foresight.ConfigError, match="training.learningRate") as e:
        one_step(model, opt)
    assert e.value.permanent and ps.status()["version"] == 0


def test_sparse_gradients_and_bad_arguments_are_config_errors(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    with pytest.raises(foresight.ConfigError, match="sparse=False"):
        foresight.torch.Optimizer(torch.nn.Embedding(10, 3, sparse=True))
    with pytest.raises(foresight.ConfigError, match="grad_dtype") as e:
        foresight.torch.Optimizer(tiny_model(), grad_dtype="fp8")
    assert e.value.permanent
    reserved = torch.nn.Module()  # a parameter named optimizer.momentum.weight, which checkpoints reserve
    reserved.optimizer = torch.nn.Module()
    reserved.optimizer.momentum = torch.nn.Linear(2, 2)
    with pytest.raises(foresight.ConfigError, match="reserved"):
        foresight.torch.Optimizer(reserved)


def test_the_clients_logs_reach_python_logging_and_name_the_url(job_env, caplog, monkeypatch):
    """A mistyped PS address: the client's retries are logged as they happen (they were
    dropped: the worker hung silently until the deadline), and the error names the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    class Nowhere:
        url = f"http://127.0.0.1:{port}"

    job_env(Nowhere)
    monkeypatch.setenv("FORESIGHT_PS_DEADLINE_SECONDS", "2")
    with caplog.at_level(logging.INFO, logger="foresight"):
        with pytest.raises(foresight.UnreachableError, match=f"127.0.0.1:{port}"):
            foresight.torch.Optimizer(tiny_model())
    retries = [r for r in caplog.records if r.name == "foresight" and "retrying" in r.getMessage()]
    assert retries and retries[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]


HANGING_WORKER = textwrap.dedent(
    """
    import logging, os, sys, time, torch, foresight, foresight.torch
    foresight.init()
    if os.environ.get("SLOW_LOG_HANDLER"):
        class Slow(logging.Handler):
            def emit(self, record):
                print("handling", flush=True)
                time.sleep(3)  # the signal comes while the client's first record is handled
        logging.getLogger("foresight").addHandler(Slow())
        logging.getLogger("foresight").setLevel(logging.DEBUG)
    print("joining", flush=True)
    foresight.torch.Optimizer(torch.nn.Linear(2, 2))
    """
)


@pytest.mark.parametrize("in_a_log_handler", [False, True])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_a_worker_waiting_on_a_stuck_ps_within_a_second(tmp_path, signum, in_a_log_handler):
    """A PS that accepts connections and never answers (alive but stuck): the join waits on the
    network, and Ctrl-C or the kubelet's SIGTERM must end the worker at once, not after the
    300 s deadline (Python runs signal handlers only between bytecodes, and the native wait
    never returned to it). Also when the signal's exception is raised inside a `logging` handler
    that the wait hands the client's records to (it was printed as a logging error and dropped,
    and the worker waited on: this test's SIGINT case timed out in some full runs)."""
    stuck = socket.socket()
    stuck.bind(("127.0.0.1", 0))
    stuck.listen(16)  # never accepted: the kernel completes the handshake, no one answers
    stuck_ps = type("Stuck", (), {"url": f"http://127.0.0.1:{stuck.getsockname()[1]}"})
    env = worker_env(stuck_ps, WORKER_INDEX=0)
    if in_a_log_handler:
        env.update(SLOW_LOG_HANDLER="1", FORESIGHT_LOG="debug")  # the connection's first records
    script = tmp_path / "worker.py"
    script.write_text(HANGING_WORKER)
    # Ctrl-C as from a terminal: a process started with SIGINT ignored (a non-interactive shell's
    # `&`, as CI and `nohup make test &` start this suite) keeps ignoring it, Python included.
    interruptible = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    worker = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)  # fmt: skip
    try:
        assert worker.stdout.readline().strip() == "joining"
        if in_a_log_handler:
            assert worker.stdout.readline().strip() == "handling"
        else:
            time.sleep(1.0)  # well inside the native call
        assert worker.poll() is None
        sent = time.monotonic()
        worker.send_signal(signum)
        worker.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        worker.kill()
        worker.wait()
        stuck.close()
    print(f"{signal.Signals(signum).name}: ended after {took:.2f} s with {worker.returncode}")
    assert took < 1.5
    # An uncaught KeyboardInterrupt ends Python by SIGINT itself; the package's handler, 143.
    assert worker.returncode == (-signal.SIGINT if signum == signal.SIGINT else 128 + signal.SIGTERM)
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in worker.stderr.read()


def test_the_context_manager_finishes_and_a_step_after_it_sends_nothing(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    model = tiny_model()
    with foresight.worker(model) as opt:
        one_step(model, opt)
    assert opt.finished and ps.status()["finalized"]
    one_step(model, opt)  # pushed to a PS that was told this worker left, before
    assert ps.status()["version"] == 1
    assert foresight.finish() is foresight.job().done, "finishing twice is finishing once"


def test_a_second_thread_reading_the_step_during_a_push_waits_its_turn(ps_factory, job_env):
    """A metrics thread reading `job.step` while the main thread pushes got PyO3's "Already
    borrowed" RuntimeError."""
    import threading

    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    seen, errors, stop = [], [], threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(foresight.job().step)
            except Exception as e:  # noqa: BLE001 - the failure under test
                errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(30):
        one_step(model, opt)
    stop.set()
    reader.join()
    assert not errors and seen == sorted(seen) and seen[-1] == 30


def test_the_package_has_a_version():
    assert foresight.__version__ == foresight._native.__version__
    assert json.loads(json.dumps(foresight.__version__)).count(".") == 2
    assert TOKEN  # the fixtures' token, used by every test here


def test_a_join_from_a_version_the_ps_cannot_speak_to_is_refused_naming_both(ps_factory, job_env):
    import urllib.error
    import urllib.request

    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    foresight.torch.Optimizer(tiny_model())  # this wheel's version: joined

    def join(version: str) -> tuple[int, dict]:
        req = urllib.request.Request(
            f"{ps.url}/v1/join?worker=0",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "x-foresight-client-version": version},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = join("7.3.0")
    assert (status, body["reason"]) == (400, "version_mismatch"), body
    assert "7.3.0" in body["error"] and foresight.__version__ in body["error"]
    assert join(foresight.__version__)[0] == 200


def test_wrapped_models_keep_their_own_names_and_groups_cannot_be_added(ps_factory, job_env):
    """torch.compile and DataParallel prefix every name (`_orig_mod.`, `module.`): the layout was
    the wrapper's, another than an unwrapped or Rust worker's, and the final file carried it."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps)
    plain = sorted(n for n, _ in tiny_model().named_parameters())
    opt = foresight.torch.Optimizer(torch.nn.DataParallel(torch.compile(tiny_model())))
    assert opt._names == plain
    with pytest.raises(foresight.ConfigError, match="no further parameter groups"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], "weight_decay": 0.0})


def test_a_permanent_error_exits_3_after_the_scripts_atexit_handlers(ps_factory, tmp_path):
    """The status that fails the job at once, and still the script's own exit handlers (a
    logging flush, wandb, TensorBoard writers): os._exit skipped them before."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    flushed = tmp_path / "flushed"
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, pathlib, foresight
            foresight.init()
            atexit.register(lambda: pathlib.Path({str(flushed)!r}).write_text("yes"))
            raise foresight.ConfigError("a setting no retry can fix")
            """
        )
    )
    run = subprocess.run([sys.executable, str(script)], env=worker_env(ps, WORKER_INDEX=0), capture_output=True, text=True, timeout=60)
    assert run.returncode == foresight.EXIT_PERMANENT, run.stderr
    assert flushed.read_text() == "yes"
    assert "a setting no retry can fix" in run.stderr


def test_a_bad_holdout_in_the_environment_is_a_config_error(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.1)
    job_env(ps, holdout="twenty percent")
    with pytest.raises(foresight.ConfigError, match="HOLDOUT='twenty percent' is not a number"):
        foresight.split(100)
    job_env(ps, holdout=1.5)
    with pytest.raises(foresight.ConfigError, match="between 0 and 1"):
        foresight.split(100)
    job_env(ps, holdout=0.25)
    train, test = foresight.split(100)
    assert (len(train), len(test)) == (75, 25)
