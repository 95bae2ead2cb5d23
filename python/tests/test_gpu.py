"""The package on a CUDA device (skipped without one; scripts/gpu-check-python.sh runs it on a
lent GPU): pinned host buffers, non-blocking loads, and a model moved to the GPU after the
Optimizer was built, as the Hugging Face Trainer does."""

from __future__ import annotations

import pytest
import torch

import foresight
import foresight.torch
from test_worker import LR, one_step, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_a_step_on_the_gpu_is_the_rule_exactly_through_pinned_buffers(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    model = tiny_model().cuda()
    opt = foresight.torch.Optimizer(model)
    assert opt._flat.is_pinned() and opt._grad.is_pinned()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = one_step(model, opt)
    torch.cuda.synchronize()
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), before[n] - LR * grads[n], atol=1e-6), n
    assert ps.status()["version"] == 1


def test_a_model_moved_to_the_gpu_after_the_optimizer_gets_pinned_buffers(ps_factory, job_env):
    ps = ps_factory(workers=1, algorithm="asgd", learning_rate=LR)
    job_env(ps)
    model = tiny_model()
    opt = foresight.torch.Optimizer(model)
    assert not opt._flat.is_pinned()
    model.cuda()  # what the Trainer does after the Optimizer exists
    one_step(model, opt)
    assert opt._flat.is_pinned() and opt._grad.is_pinned()
    foresight.finish()
    assert all(p.device.type == "cuda" for p in model.parameters())
