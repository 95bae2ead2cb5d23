"""The package's paths the review found untested, against a real `foresight-ps` on loopback:
pushEvery/pullEvery (the mean and the cadence), the leftover push at finish, the resume offset of
`foresight.batches`, and parameters without a gradient."""

from __future__ import annotations

import torch

import foresight
import foresight.torch
from test_worker import LR, tiny_model


def step_with(model: torch.nn.Module, opt: foresight.torch.Optimizer, scale: float) -> dict[str, torch.Tensor]:
    """A backward whose gradient is `scale` times a fixed one; returns the gradients."""
    x = torch.arange(8, dtype=torch.float32).view(2, 4) / 8
    loss = scale * torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    return grads


def test_push_every_sends_the_mean_on_one_pulled_model_and_finish_sends_the_rest(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps, push_every=2, pull_every=2)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    g1 = step_with(model, opt, 1.0)
    assert ps.status()["version"] == 0, "nothing pushed after the first of two steps"
    g2 = step_with(model, opt, 3.0)  # on the same model: no pull in between
    assert ps.status()["version"] == 1
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), w0[n] - LR * (g1[n] + g2[n]) / 2, atol=1e-6), n
    w1 = {n: p.detach().clone() for n, p in model.named_parameters()}
    g3 = step_with(model, opt, 1.0)  # one step of the next two: the leftover
    assert ps.status()["version"] == 1
    foresight.finish()
    assert ps.status()["version"] == 2, "finish pushed the last step"
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), w1[n] - LR * g3[n], atol=1e-6), (n, "a window of one is its own mean")


def test_a_replaced_process_resumes_batches_at_the_next_batch(ps_factory, job_env):
    ps = ps_factory(workers=2, algorithm="asgd", learning_rate=LR)
    job_env(ps, worker=0, epochs=3, batch_size=10)
    opt = foresight.torch.Optimizer(tiny_model())
    first = foresight.batches(100)
    trained = [next(first) for _ in range(7)]  # 5 steps per epoch: epoch 0 and 2 of epoch 1
    for _ in trained:
        step_with(opt.model, opt, 1.0)
    rest = list(first)
    assert [e for e, _ in trained] == [0] * 5 + [1] * 2 and len(rest) == 8
    job_env(ps, worker=0, epochs=3, batch_size=10)  # a new process of worker 0
    foresight.torch.Optimizer(tiny_model())
    assert foresight.resume_step() == 7
    assert list(foresight.batches(100)) == rest, "the same batches, from the one after the last step"


def test_a_parameter_without_a_gradient_is_pushed_as_zeros_and_left_as_it_was(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    class WithUnused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()
            self.unused = torch.nn.Linear(2, 2)  # in the model, not in its forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = WithUnused()
    opt = foresight.torch.Optimizer(model)
    before = model.unused.weight.detach().clone()
    step_with(model, opt, 1.0)
    # On the CPU its .grad is its view into the pushed buffer (docs/python.md): zeros, not None.
    assert model.unused.weight.grad is not None and not model.unused.weight.grad.any()
    assert torch.equal(model.unused.weight.detach(), before)
    assert ps.status()["version"] == 1
