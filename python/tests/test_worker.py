"""The `foresight` package against a real `foresight-ps` on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch

import foresight
import foresight.torch
from conftest import BIN, ROOT, TOKEN, ca_signed_cert
from h2proxy import DroppingProxy

LR = 0.1
# How far below the byte-frequency (unigram) loss the transformer example must get in one epoch,
# in nats per byte: 0.5 needs context (the corpus's bigram entropy is 0.77 below its unigram one).
LEARNED_CONTEXT = 0.5


def tiny_model(seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def one_step(model: torch.nn.Module, opt: foresight.torch.Optimizer) -> dict[str, torch.Tensor]:
    """A real backward on a fixed batch; returns each parameter's gradient."""
    device = next(model.parameters()).device
    x = torch.arange(8, dtype=torch.float32, device=device).view(2, 4) / 8
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1], device=device))
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return grads


def test_outside_a_job_init_names_what_is_missing(monkeypatch):
    for k in list(os.environ):
        if k.startswith("FORESIGHT_"):
            monkeypatch.delenv(k)
    foresight._job = None
    with pytest.raises(foresight.ConfigError, match=r"\$FORESIGHT_PS_URL and \$FORESIGHT_WORKER_INDEX are not set"):
        foresight.init()
    monkeypatch.setenv("FORESIGHT_PS_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("FORESIGHT_WORKER_INDEX", "zero")
    with pytest.raises(foresight.ConfigError, match="FORESIGHT_WORKER_INDEX='zero' is not an integer"):
        foresight.init()
    monkeypatch.setenv("FORESIGHT_WORKER_INDEX", "0")
    monkeypatch.setenv("FORESIGHT_SLOWDOWN", "0.5")
    with pytest.raises(foresight.ConfigError, match=r"\$FORESIGHT_SLOWDOWN=0.5 must be at least 1"):
        foresight.init()


def test_a_worker_trains_over_tls_trusting_the_ca_file(ps_factory, job_env, tmp_path):
    """An https:// PS: the package's client trusts $FORESIGHT_PS_CA_FILE's certificates, and
    without it names the variable instead of sending anything."""
    cert, key, ca = ca_signed_cert(tmp_path)
    ps = ps_factory(tls=(cert, key, ca), workers=1, algorithm="asgd", learning_rate=LR)
    assert ps.url.startswith("https://")
    job_env(ps)
    with pytest.raises(foresight.ForesightError, match="FORESIGHT_PS_CA_FILE"):
        foresight.torch.Optimizer(tiny_model())
    job_env(ps, ps_ca_file=ca)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    one_step(model, opt)
    assert ps.status()["version"] == 1


def int8_step_bound(g: torch.Tensor) -> torch.Tensor:
    """Half of int8's scale step per element: a scale per 1,024 values (row-major), absmax/127."""
    flat = g.reshape(-1)
    pad = (-flat.numel()) % 1024
    chunks = torch.nn.functional.pad(flat.abs(), (0, pad)).view(-1, 1024)
    step = chunks.max(dim=1).values / 127
    return (step.repeat_interleave(1024)[: flat.numel()] / 2).view_as(g)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
def test_a_step_changes_the_model_by_the_rule_exactly(ps_factory, job_env, dtype):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = foresight.torch.Optimizer(model, grad_dtype=dtype)
    assert foresight.resume_step() == 0 and foresight.job().workers == 1
    grads = one_step(model, opt)
    assert ps.status()["version"] == 1
    for name, p in model.named_parameters():
        g = grads[name].to(torch.bfloat16).float() if dtype == "bf16" else grads[name]
        # asgd: w ← w − η·g in float32; the parameters now hold the PS's model after the step.
        expected = before[name] - torch.tensor(LR, dtype=torch.float32) * g
        if dtype == "int8":
            # Within half a scale step of each element's gradient, and not the exact f32 step.
            bound = LR * int8_step_bound(grads[name]) * (1 + 1e-4) + 1e-7
            assert ((p.detach() - expected).abs() <= bound).all(), name
        else:
            assert torch.equal(p.detach(), expected), name
        assert not torch.equal(p.detach(), before[name]), name


def test_gradients_and_parameters_live_in_the_clients_buffers_and_stay_exact_whoever_touches_them(
    ps_factory, job_env
):
    """On the CPU the parameters' gradients are views into the buffer the client pushes, and
    their values views into the buffer it pulls into: neither takes memory of its own. What is
    pushed stays each step's exact gradient, and what is pulled the parameters' values, when the
    script zeroes through the module (``model.zero_grad()`` sets them to ``None``), drops a
    gradient, or replaces a parameter's tensor (``p.data = ...``)."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    flat = opt._grad
    inside = range(flat.data_ptr(), flat.data_ptr() + 4 * flat.numel())
    pulled = range(opt._flat.data_ptr(), opt._flat.data_ptr() + 4 * opt._flat.numel())

    def exact_step(zero: Callable[[], None], drop: str | None = None) -> None:
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        x = torch.arange(8, dtype=torch.float32).view(2, 4) / 8
        loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
        zero()
        loss.backward()
        if drop is not None:
            dict(model.named_parameters())[drop].grad = None
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        for name, p in model.named_parameters():
            assert p.grad.data_ptr() in inside, f"{name}'s gradient is not a view into the pushed buffer"
            assert p.data_ptr() in pulled, f"{name} is not a view into the buffer pulled into"
            assert torch.equal(p.detach(), before[name] - torch.tensor(LR) * grads[name]), name

    exact_step(opt.zero_grad)
    exact_step(model.zero_grad, drop="2.bias")
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters()), "zeroed in place, kept"
    exact_step(opt.zero_grad)
    weight = dict(model.named_parameters())["0.weight"]
    weight.data = weight.data.clone()  # the script's own tensor: the next pull still lands in it
    exact_step(opt.zero_grad)
    assert ps.status()["version"] == 4
    assert torch.equal(opt._flat, torch.cat([p.detach().reshape(-1) for _, p in sorted(model.named_parameters())]))


def test_an_overlapped_exchange_computes_on_the_model_one_exchange_older_and_is_compensated_for_it(
    ps_factory, job_env
):
    """overlap=True: step 2 computes on the initial model still (the model pulled by step 1's
    exchange is loaded only at step 2's end), so its gradient is one update staler, and its push
    names the model it was computed on. dc-asgd-c compensates against exactly that one: the PS's
    second update is w1 − η·(g + λ0·g⊙g⊙(w1 − w0)), w0 being the initial model, not w1 (which a
    PS keeping only the last pull's backup would refuse as pull_required)."""
    lam = 100.0  # large, so that the compensation term stands well clear of float32 rounding
    ps = ps_factory(workers=1, algorithm="dc-asgd-c", learning_rate=LR, lambda0=lam)
    job_env(ps)
    model = tiny_model()
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = foresight.torch.Optimizer(model, overlap=True)
    g1 = one_step(model, opt)
    assert all(torch.equal(p.detach(), w0[n]) for n, p in model.named_parameters()), "not loaded yet"
    g2 = one_step(model, opt)  # computed on w0 again: the same batch gives the same gradient
    assert all(torch.equal(g1[n], g2[n]) for n in g1)
    w1 = {n: w0[n] - LR * g1[n] for n in w0}  # the first update: w_bak = w0 = w, no compensation
    assert all(torch.allclose(p.detach(), w1[n], rtol=0, atol=1e-6) for n, p in model.named_parameters())
    foresight.finish()
    status = ps.status()
    assert status["version"] == 2
    pushes, discarded, staleness = foresight.job().native.push_stats
    assert (pushes, discarded, staleness) == (2, 0, 1), "the second gradient is one update stale, taken"
    gap = 0.0
    for name, p in model.named_parameters():
        g = g2[name]
        compensated = w1[name] - LR * (g + lam * g * g * (w1[name] - w0[name]))
        assert torch.allclose(p.detach(), compensated, rtol=0, atol=1e-6), name
        gap = max(gap, (compensated - (w1[name] - LR * g)).abs().max().item())
    assert gap > 1e-4, f"the compensation stands clear of the tolerance: {gap}"


def test_overlap_is_refused_where_it_cannot_work(ps_factory, job_env):
    """With sync (a round takes only gradients of its own version) and with an inner optimizer
    (local steps), overlap=True is a ConfigError naming the fields, before anything is sent."""
    ps = ps_factory(workers=1, algorithm="sync", learning_rate=LR)
    job_env(ps, algorithm="sync")
    with pytest.raises(foresight.ConfigError, match="optimizer.algorithm sync"):
        foresight.torch.Optimizer(tiny_model(), overlap=True)
    job_env(ps, local_steps=4, algorithm="asgd")
    with pytest.raises(foresight.ConfigError, match="optimizer.localSteps"):
        foresight.torch.Optimizer(tiny_model(), overlap=True)
    job_env(ps, overlap=2)
    with pytest.raises(foresight.ConfigError, match="FORESIGHT_OVERLAP='2'"):
        foresight.init()
    assert ps.status()["registered"] is False, "nothing was sent"
    # A worker's environment does not carry the job's rule (the operator and `foresight run` give
    # it to the PS): the join's answer does, and the overlap is refused all the same, once joined.
    job_env(ps)
    with pytest.raises(foresight.ConfigError, match="optimizer.algorithm sync"):
        foresight.torch.Optimizer(tiny_model(), overlap=True)


def test_a_model_pulled_in_bf16_is_the_ps_float32_model_rounded(ps_factory, job_env):
    """pull_dtype="bf16": the worker computes on the PS's model rounded to bf16, and the PS keeps
    and steps its float32 model (w ← w − η·g on the unrounded weights)."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    with pytest.raises(ValueError, match="pull_dtype"):
        foresight.torch.Optimizer(tiny_model(), pull_dtype="fp8")
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rounded = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    opt = foresight.torch.Optimizer(model, pull_dtype="bf16")
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), rounded(before[name])), name
        assert not torch.equal(p.detach(), before[name]), f"{name}: the pull rounded nothing"
    grads = one_step(model, opt)
    assert ps.status()["version"] == 1
    for name, p in model.named_parameters():
        expected = before[name] - torch.tensor(LR, dtype=torch.float32) * grads[name]
        assert torch.equal(p.detach(), rounded(expected)), name


def test_a_model_pulled_in_int8_is_the_difference_from_the_workers_copy(ps_factory, job_env):
    """pull_dtype="int8": the first pull is the whole model in float32; the next is the int8
    difference from the worker's copy, so the worker holds the PS's new model to within half a
    scale step of the difference."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = foresight.torch.Optimizer(model, pull_dtype="int8")
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    grads = one_step(model, opt)
    assert ps.status()["version"] == 1
    for name, p in model.named_parameters():
        step = torch.tensor(LR, dtype=torch.float32) * grads[name]
        expected = before[name] - step
        bound = int8_step_bound(step) * (1 + 1e-4) + 1e-7
        assert ((p.detach() - expected).abs() <= bound).all(), name


def test_local_steps_send_one_pseudo_gradient_and_the_ps_takes_its_outer_step(ps_factory, job_env):
    """optimizer.localSteps: 3 with the user's SGD as the inner optimizer and DiLoCo's outer
    step on the PS (Nesterov, lr 0.7, momentum 0.9): nothing is sent for two steps, then
    θ0 − θ_local once, and the worker continues from the PS's outer step."""
    h, outer_lr, mu = 3, 0.7, 0.9
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=outer_lr, momentum=mu, nesterov="true")
    job_env(ps, local_steps=h)
    model = tiny_model()
    reference = tiny_model()  # the same initial weights, trained by plain torch below
    opt = foresight.torch.Optimizer(model, inner=torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    for k in range(h):
        one_step(model, opt)
        x = torch.arange(8, dtype=torch.float32).view(2, 4) / 8
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), torch.tensor([0, 1])).backward()
        ref_opt.step()
        assert ps.status()["version"] == (1 if k == h - 1 else 0), f"after step {k + 1}"
    for name, p in model.named_parameters():
        delta = theta0[name] - dict(reference.named_parameters())[name].detach()
        m = delta  # the first outer step: momentum starts at 0
        expected = theta0[name] - outer_lr * (delta + mu * m)
        assert torch.allclose(p.detach(), expected, atol=1e-6), name
    assert ps.status()["version"] == 1


def test_the_worker_trains_the_local_steps_the_ps_tells_it(ps_factory, job_env):
    """optimizer.adaptiveLocalSteps: the PS answers each push with the worker's next H. Before
    any exchange is measured it is the job's localSteps (3); once one is, a round of the
    exchange's time over a tiny communication fraction is longer than 7 of these steps, so the PS
    says the most allowed, 7, and the script's loop, unchanged, follows it."""
    ps = ps_factory(
        workers=1, algorithm="asgd", learning_rate=0.5,
        local_steps=3, local_steps_min=2, local_steps_max=7, communication_fraction=1e-4,
    )
    job_env(ps, local_steps=3)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model, inner=torch.optim.SGD(model.parameters(), lr=0.1))
    versions, told = [], []
    for _ in range(13):
        one_step(model, opt)
        versions.append(ps.status()["version"])
        told.append(opt.local_steps)
    # Pushes after steps 3 (told 3: nothing measured yet), 6 (told 7), then 13.
    assert versions == [0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3], versions
    assert told[:3] == [3, 3, 3] and told[5:] == [7] * 8, told
    metrics = urllib.request.urlopen(f"{ps.url}/metrics", timeout=5).read().decode()
    told_gauge = re.search(r'^foresight_ps_local_steps\{[^}]*worker="0"[^}]*\} (\d+)$', metrics, re.M)
    assert told_gauge and int(told_gauge.group(1)) == 7, metrics
    trained = re.search(r"^foresight_ps_trained_steps_total\{[^}]*\} (\d+)$", metrics, re.M)
    assert trained and int(trained.group(1)) == 13, metrics


def test_local_steps_train_with_the_jobs_inner_optimizer_unless_the_script_passes_one(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.5)
    job_env(ps, local_steps=2, inner_optimizer="sgd", inner_learning_rate=0.25, inner_weight_decay=0.01)
    opt = foresight.torch.Optimizer(tiny_model())
    assert isinstance(opt._inner, torch.optim.SGD)
    assert opt._inner.defaults["lr"] == 0.25 and opt._inner.defaults["weight_decay"] == 0.01
    job_env(ps, local_steps=2, inner_optimizer="adam")
    with pytest.raises(foresight.ConfigError, match="INNER_OPTIMIZER='adam': expected sgd or adamw"):
        foresight.init()


def test_an_inner_adam_without_local_steps_pushes_each_steps_change(ps_factory, job_env):
    """localSteps 1 with inner=Adam (refused before): each step's change θ_pulled − θ_local is
    the push, and asgd at learning rate 1 makes the PS's model the worker's Adam-stepped one;
    a scheduler on the inner optimizer is the user's and drives it."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=1.0)
    job_env(ps)
    model, reference = tiny_model(), tiny_model()
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    schedule = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
    opt = foresight.torch.Optimizer(model, inner=inner)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    ref_schedule = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    x = torch.arange(8, dtype=torch.float32).view(2, 4) / 8
    for step in range(1, 4):
        one_step(model, opt)
        schedule.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), torch.tensor([0, 1])).backward()
        ref_opt.step()
        ref_schedule.step()
        assert ps.status()["version"] == step
        for (name, p), r in zip(model.named_parameters(), reference.parameters()):
            assert torch.allclose(p.detach(), r.detach(), atol=1e-6), (step, name)
    job_env(ps, push_every=2)
    with pytest.raises(foresight.ConfigError, match="pushEvery and pullEvery"):
        foresight.torch.Optimizer(tiny_model(), inner=torch.optim.Adam(tiny_model().parameters()))


def test_a_push_whose_answer_was_lost_is_retried_and_applied_once(ps_factory, job_env, monkeypatch):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    versions_at_drop: list[int] = []
    proxy = DroppingProxy(ps.port, on_drop=lambda: versions_at_drop.append(ps.status()["version"]))
    job_env(ps)
    monkeypatch.setenv("FORESIGHT_PS_URL", f"http://127.0.0.1:{proxy.port}")
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = foresight.torch.Optimizer(model)
    proxy.arm()
    grads = one_step(model, opt)
    proxy.close()
    # The push reached the PS and was applied; its answer was lost; the client pushed the same
    # (generation, seq) again, which the PS answered as a replay instead of applying it twice.
    assert proxy.dropped == 1 and versions_at_drop == [1]
    assert ps.status()["version"] == 1
    for name, p in model.named_parameters():
        expected = before[name] - torch.tensor(LR, dtype=torch.float32) * grads[name]
        assert torch.equal(p.detach(), expected), name


def test_the_first_workers_model_is_everyones_and_shards_are_disjoint(ps_factory, job_env):
    ps = ps_factory(workers=2, algorithm="asgd", learning_rate=LR)
    job_env(ps, worker=0)
    first = tiny_model(seed=1)
    foresight.torch.Optimizer(first)
    shard0 = foresight.shard(10)
    job_env(ps, worker=1)
    second = tiny_model(seed=2)  # other initial weights: the PS's replace them at join
    foresight.torch.Optimizer(second)
    for (n, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), n
    shard1 = foresight.shard(10)
    assert sorted(shard0 + shard1) == list(range(10)) and not set(shard0) & set(shard1)


def test_a_wrong_token_is_refused_for_good(ps_factory, job_env, monkeypatch):
    ps = ps_factory(workers=1)
    job_env(ps)
    monkeypatch.setenv("FORESIGHT_TOKEN", "not-" + TOKEN)
    with pytest.raises(foresight.RefusedError) as e:
        foresight.torch.Optimizer(tiny_model())
    assert e.value.reason == "unauthorized" and e.value.status == 401 and e.value.permanent


def test_a_model_of_another_shape_is_refused_with_the_reason(ps_factory, job_env):
    ps = ps_factory(workers=2, algorithm="asgd")
    job_env(ps, worker=0)
    foresight.torch.Optimizer(tiny_model())
    job_env(ps, worker=1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    with pytest.raises(foresight.ForesightError) as e:
        foresight.torch.Optimizer(other)
    assert e.value.permanent and e.value.reason == "other_model", e.value
    # The first difference, named: sorted by name, "0.bias" comes first, 5 values here, 3 there.
    assert "tensor 0 is 0.bias [5] here and 0.bias [3] on the parameter server" in str(e.value), e.value


# MNIST-5k as `make setup` extracts it, for the built-in worker's data settings.
MNIST = {"DATASET_FORMAT": "csv", "DATASET_PATH": ROOT / "data/mnist5k"}


def worker_env(ps, **settings: object) -> dict[str, str]:
    """This process's environment without its FORESIGHT_* variables, then a worker's of `ps`:
    its address and token, and FORESIGHT_<NAME> for each setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    env.update(FORESIGHT_PS_URL=ps.url, FORESIGHT_TOKEN=TOKEN)
    env.update({f"FORESIGHT_{k}": str(v) for k, v in settings.items()})
    return env


WORKER = textwrap.dedent(
    """
    import sys, torch, foresight, foresight.torch
    foresight.init()
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    opt = foresight.torch.Optimizer(model)
    print("resume", foresight.resume_step(), flush=True)
    x, y = torch.ones(8, 4), torch.zeros(8, dtype=torch.long)
    while True:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", foresight.job().step, flush=True)
    """
)


def test_a_killed_worker_is_replaced_and_resumes_at_the_ps_step(ps_factory, tmp_path):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.01)
    env = worker_env(ps, WORKER_INDEX=0)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)

    first = start()
    assert first.stdout.readline().split() == ["resume", "0"]
    while int(first.stdout.readline().split()[1]) < 25:
        pass
    first.send_signal(signal.SIGKILL)
    first.wait()
    applied = ps.status()["version"]
    assert applied >= 25
    second = start()
    try:
        resumed = int(second.stdout.readline().split()[1])
        # The PS counted every step of the killed process it applied: the new one goes on after them.
        assert resumed == applied
        assert int(second.stdout.readline().split()[1]) == resumed + 1
    finally:
        second.kill()
        second.wait()


@pytest.mark.parametrize("kind", ["python", "rust"])
def test_sigterm_ends_a_worker_that_is_pid_1_of_its_container(ps_factory, tmp_path, kind):
    """A worker is PID 1 of its container (the image's entrypoint, or the script `workers.command`
    runs), where a signal without a handler is ignored: the kubelet's SIGTERM must still end it
    (143) at once, not after the grace period. Here the worker is PID 1 of a PID namespace of its
    own (unshare), signalled from outside it as the container runtime does."""
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=0.01)
    env = worker_env(ps, WORKER_INDEX=0)
    if kind == "python":
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        command = [sys.executable, str(script)]
    else:
        command = [str(BIN / "foresight-worker")]
        env = worker_env(ps, WORKER_INDEX=0, **MNIST, MODEL="mlp", EPOCHS=100, REPORT_EVERY=1, METRICS_ADDR="")
    box = subprocess.Popen(["unshare", "--pid", "--fork", *command], env=env, stdout=subprocess.PIPE, text=True)
    try:
        # Training: a step was pushed.
        while not box.stdout.readline().startswith(("step", '{"event":"progress"')):
            assert box.poll() is None, "the worker ended before training"
        (worker,) = [
            int(pid)
            for task in os.listdir(f"/proc/{box.pid}/task")
            for pid in open(f"/proc/{box.pid}/task/{task}/children").read().split()
        ]
        status = open(f"/proc/{worker}/status").read()
        assert "\nNSpid:\t%d\t1\n" % worker in status, "the worker is not PID 1 of its namespace"
        os.kill(worker, signal.SIGTERM)
        box.communicate(timeout=10)  # its output to the end: it ends at once, or the test fails here
        assert box.returncode == 128 + signal.SIGTERM
    finally:
        box.kill()
        box.wait()


def test_foresight_run_trains_mnist_with_python_workers(tmp_path):
    """The example as written, shortened to 3 epochs: 4 Python workers under `foresight run`."""
    job = (ROOT / "examples/python/mnist.yaml").read_text()
    job = job.replace("epochs: 12", "epochs: 3").replace("milestones: [6, 9]", "milestones: [2]")
    started = time.monotonic()
    summary, out = foresight_run(tmp_path, job)
    print(f"3 epochs in {time.monotonic() - started:.0f} s: accuracy {summary['accuracy']}")
    assert summary["accuracy"] > 0.9, summary
    assert len(summary["per_worker"]) == 4 and summary["updates"] > 0
    assert (out / "model-final.safetensors").exists()


def foresight_run(tmp_path, job: str) -> tuple[dict, object]:
    """`foresight run` of the spec `job` from the repository root: its summary and output folder."""
    spec = tmp_path / "job.yaml"
    spec.write_text(job)
    out = tmp_path / "out"
    run = subprocess.run(
        [str(BIN / "foresight"), "run", str(spec), "--out", str(out), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "summary.json").read_text()), out


def test_rust_and_python_workers_train_one_model_together(ps_factory, tmp_path):
    """2 built-in `lenet5` workers and 2 of examples/python/mnist.py in one job: the same layout,
    shards and held-out split, so the PS cannot tell them apart; the Rust evaluator then scores the
    final model on the held-out split."""
    ps = ps_factory(workers=4, algorithm="dc-asgd-a", learning_rate=0.05)
    env = worker_env(
        ps, **MNIST, MODEL="lenet5", HOLDOUT=0.2, EPOCHS=2, BATCH_SIZE=32, SEED=1, TORCH_THREADS=1, METRICS_ADDR=""
    )
    commands = [[str(BIN / "foresight-worker")]] * 2 + [[sys.executable, str(ROOT / "examples/python/mnist.py")]] * 2
    # Each worker's termination message file, as the kubelet gives one (/dev/termination-log): the
    # job's last worker records in it where the PS, finalizing itself as it left, wrote the model.
    records = [tmp_path / f"termination-log-{i}" for i in range(4)]
    # Worker 1 (Rust) and worker 3 (Python) are slowed 1.5× (`foresight run --slow-worker`'s
    # variable): each sleeps half its step's own work after the step.
    slowed = {1: "1.5", 3: "1.5"}
    procs = [
        subprocess.Popen(
            cmd,
            env={
                **env,
                "FORESIGHT_WORKER_INDEX": str(i),
                "FORESIGHT_TERMINATION_MESSAGE": str(records[i]),
                "FORESIGHT_SLOWDOWN": slowed.get(i, "1"),
            },
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, cmd in enumerate(commands)
    ]
    done = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        done += [e for e in events if e["event"] == "done"]
    assert sorted(d["worker"] for d in done) == [0, 1, 2, 3]
    assert all(d["discarded"] == 0 and d["pushes"] > 0 for d in done), done
    # Both kinds say where their time went, in the same phases, within their run's time.
    for d in done:
        phases = d["phases"]
        assert list(phases) == list(foresight.torch.PHASES), d
        assert all(phases[p] > 0 for p in ("pull", "load", "compute", "gather", "push")), d
        assert sum(phases.values()) <= d["seconds"], d
        # A slowed worker sleeps half of each step's own work, never of its pulls and pushes
        # (a straggler's device is slow, not its link): the Rust worker's work is load, compute
        # and gather; the Python worker's is everything but the exchange, its script included.
        if d["worker"] == 1:
            # Each step's sleep is asked for as half its work. On 2 cores shared by 5 processes a
            # sleep ends late by up to a scheduling quantum, which at ~8 ms of work per step came
            # to 0.64 of the work once. Sleeping half the exchange as well would pass 0.75 of it
            # whenever the exchange takes half the work or more.
            work = sum(phases[p] for p in ("load", "compute", "gather"))
            assert 0.45 * work < phases["slowdown"] < 0.75 * work, d
        elif d["worker"] == 3:
            work = sum(phases.values()) - phases["slowdown"] - phases["pull"] - phases["push"]
            assert 0.35 * work < phases["slowdown"] < 0.6 * work, d
        else:
            assert phases["slowdown"] == 0, d
    req = urllib.request.Request(f"{ps.url}/v1/finalize", method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
    final = json.loads(urllib.request.urlopen(req, timeout=30).read())
    recorded = [json.loads(r.read_text()) for r in records if r.exists()]
    # (Two leaves at the same moment may both find every worker finished: both record the same.)
    assert recorded and all(r == {"finalModel": final} for r in recorded), f"{recorded} against {final}"
    model = final["path"]
    evaluated = subprocess.run(
        [str(BIN / "foresight-worker"), "evaluate", "--model-file", model],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    accuracy = json.loads(evaluated.stdout.splitlines()[0])["accuracy"]
    print(f"final model of 2 Rust + 2 Python workers, 2 epochs: held-out accuracy {accuracy:.4f}")
    # What this checks is that the two kinds of worker train one model (chance is 0.1; a layout
    # or shard mismatch would be far below). The asynchronous schedule's luck spreads it: 0.895
    # to 0.932 over 4 runs at 2 epochs (one of them in make test), and 0.890 to 0.923 at 3.
    assert accuracy > 0.85


def unigram_entropy(path) -> float:
    """Nats per byte of the best model that ignores context: the bytes' own frequencies."""
    counts = torch.bincount(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long(), minlength=256)
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log()).sum())


def test_the_transformer_example_learns_more_than_byte_frequencies(tmp_path):
    """examples/python/charlm.yaml as written, shortened to 1 epoch: 4 Python workers train the
    byte-level transformer through the PS; the final model's held-out loss must be well below the
    corpus's unigram entropy (a model that only learned byte frequencies sits at it)."""
    corpus = ROOT / "data/torch-nn/corpus.txt"
    job = (ROOT / "examples/python/charlm.yaml").read_text()
    assert "epochs: 3" in job
    summary, _ = foresight_run(tmp_path, job.replace("epochs: 3", "epochs: 1"))
    unigram = unigram_entropy(corpus)
    print(f"1 epoch, {summary['updates']} updates: held-out {summary['loss']:.3f} nats/byte, unigram {unigram:.3f}")
    assert summary["loss"] < unigram - LEARNED_CONTEXT, summary


def events(lines: Iterable[str]) -> Iterator[dict]:
    """The JSON events among a worker's stdout lines (not the Trainer's printed log dicts)."""
    for line in lines:
        if line.startswith('{"'):
            yield json.loads(line)


def test_a_hugging_face_trainer_is_a_worker_and_a_killed_one_resumes(ps_factory, tmp_path):
    """examples/python/hf_trainer.py (transformers' Trainer, a GPT-2 from a config) on 2 workers,
    1 epoch; worker 1 SIGKILLed once its Trainer logged step 100, and a new process started in
    its place. Every step of both workers is applied exactly once (the PS's version is the sum of
    the steps each worker's `done` counts, and the replacement stops at the same count as worker
    0), the Trainer's logged loss reaches the PS as progress, and the final model learned context."""
    ps = ps_factory(workers=2, algorithm="dc-asgd-a", learning_rate=0.3)
    env = worker_env(
        ps, DATASET_PATH=ROOT / "data/torch-nn", HOLDOUT=0.05, EPOCHS=1, BATCH_SIZE=16, SEED=1, TORCH_THREADS=1
    )

    def start(i: int) -> subprocess.Popen:
        command = [sys.executable, str(ROOT / "examples/python/hf_trainer.py")]
        return subprocess.Popen(command, env={**env, "FORESIGHT_WORKER_INDEX": str(i)}, stdout=subprocess.PIPE, text=True)

    first, doomed = start(0), start(1)
    for e in events(doomed.stdout):
        if e["event"] == "progress" and e["step"] >= 100:
            break
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    killed_at = ps.status()["version"]
    replacement = start(1)
    done, progress = [], []
    for p in (first, replacement):
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0
        got = list(events(out.splitlines()))
        done += [e for e in got if e["event"] == "done"]
        progress += [e for e in got if e["event"] == "progress"]
    assert sorted(d["worker"] for d in done) == [0, 1]
    steps = [d["steps"] for d in done]
    version = ps.status()["version"]
    print(f"killed at version {killed_at}; steps per worker {steps}; PS version {version}; done {done}")
    assert steps[0] == steps[1] and version == sum(steps), (steps, version)
    assert all(d["discarded"] == 0 for d in done), done
    # The replacement trained only what its killed process had not put in the model.
    (resumed,) = [d for d in done if d["worker"] == 1]
    assert resumed["pushes"] < resumed["steps"], resumed
    assert len(progress) >= 5 and progress[0]["loss"] > progress[-1]["loss"], progress
    unigram = unigram_entropy(ROOT / "data/torch-nn/corpus.txt")
    assert all(d["test_loss"] < unigram - LEARNED_CONTEXT for d in done), (done, unigram)
