"""Every command the README shows, run as written.

The README's ```sh blocks are read from the file, so a command added there without a test, or a
test that no longer matches the text, fails here. Commands run from a scratch directory that
looks like the repository to them (`examples`, `data`, and `target/release` pointing at the
binaries under test, $FORESIGHT_BIN_DIR), so `out/...` lands in the scratch directory and a
second run starts as fresh as the first. Commands that need a cluster or are the make targets
themselves are named with what runs them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, ROOT, free_port

README = (ROOT / "README.md").read_text()

# Commands that this file does not run, and what does.
RUN_ELSEWHERE = {
    "make demo": "the CI's make demo check (.ci/run) and test_the_demo_job_trains_and_its_model_evaluates below",
    "make test": ".ci/run",
    "helm install foresight charts/foresight -n foresight-system --create-namespace": "make cluster-demo",
    "kubectl apply -f examples/mnist-dcasgd-cluster.yaml -l foresight.dev/example-data=mnist5k": "make cluster-demo",
    "kubectl apply -f examples/mnist-dcasgd-cluster.yaml": "make cluster-demo",
    "kubectl get tj -w": "make cluster-demo",
}


def sh_commands(markdown: str) -> list[str]:
    """The commands of every ```sh block: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        text = re.sub(r"\\\n\s*", "", block)
        for line in text.splitlines():
            command = re.sub(r"(^|\s)#.*$", "", line).strip()
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def inline_commands(markdown: str) -> list[str]:
    """Whole commands quoted in the prose: `foresight-worker evaluate ...`, `foresight run FILE`."""
    spans = re.findall(r"`((?:target/release/)?foresight(?:-\w+)? [^`]*)`", markdown.replace("\n", " "))
    return [re.sub(r"\s+", " ", s) for s in spans if len(s.split()) >= 3]


def scratch_repo(tmp_path):
    for name in ("examples", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "release").symlink_to(BIN)
    return tmp_path


def run(command: str, cwd, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    full_env.update(env)
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    return done


def test_every_readme_command_is_run_by_a_test():
    commands = sh_commands(README)
    assert "make demo" in commands and "kubectl get tj -w" in commands, commands
    unclaimed = [c for c in commands if c not in RUN_ELSEWHERE and c not in RUN_HERE]
    assert not unclaimed, f"README commands that no test runs: {unclaimed}"
    assert [c for c in RUN_ELSEWHERE if c not in commands] == [], "RUN_ELSEWHERE names a command the README dropped"


def test_the_python_snippet_is_the_examples_code():
    """The README's loop is examples/python/mnist.py's, line by line (comments aside)."""
    snippet = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    example = {re.sub(r"\s+", " ", line.split("#")[0]).strip() for line in (ROOT / "examples/python/mnist.py").read_text().splitlines()}
    for line in snippet.splitlines():
        for statement in line.split("#")[0].split(";"):
            statement = re.sub(r"\s+", " ", statement).strip()
            # A call the README shows without its optional arguments: `foresight.finish()`.
            needle = statement[:-1] if statement.endswith("()") else statement
            if statement:
                assert any(needle in code for code in example), f"not in examples/python/mnist.py: {statement!r}"


def readme(command_start: str) -> str:
    """The one README command (a ```sh line or a quoted one) that starts with `command_start`."""
    found = [c for c in sh_commands(README) + inline_commands(README) if c.startswith(command_start)]
    assert len(found) == 1, f"{command_start!r}: {found}"
    return found[0]


def test_the_demo_job_trains_and_its_model_evaluates(tmp_path):
    """`foresight run` of the demo's job, then the README's `foresight-worker evaluate` on its
    model and the simulator on its staleness trace, each as the README writes it."""
    cwd = scratch_repo(tmp_path)
    run(readme("target/release/foresight run examples/mnist-dcasgd.yaml"), cwd)
    summary = json.loads((cwd / "out/run/summary.json").read_text())
    assert summary["accuracy"] > 0.9, summary

    # The PS's journal holds every update of the final model, each worker's share of them.
    journal = run(f"target/release/{readme('foresight journal')} --json", cwd, timeout=60).stdout
    counted = json.loads(journal)
    assert counted["updates"] == summary["updates"] == counted["last_version"], (counted, summary)
    assert sum(w["applied"] for w in counted["workers"].values()) == summary["updates"], counted

    evaluate = readme("foresight-worker evaluate").replace(" F ", " out/run/model-final.safetensors ")
    printed = json.loads(run(f"target/release/{evaluate}", cwd, timeout=300).stdout.strip().splitlines()[-1])
    assert printed["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-6), (printed, summary)

    lines = run(readme("target/release/foresight-worker simulate --algorithms dc-asgd-a --delays trace:"), cwd).stdout
    runs = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    assert [(r["algorithm"], r["delay"]) for r in runs] == [("dc-asgd-a", "trace")], runs
    # The demo's 4 workers keep τ small: the simulated run trains as the real one did.
    assert runs[0]["accuracy"] > 0.5 and runs[0]["staleness"]["max"] <= summary["staleness"]["max"], runs


def test_the_simulator_command(tmp_path):
    lines = run(readme("target/release/foresight-worker simulate --algorithms asgd"), scratch_repo(tmp_path)).stdout
    runs = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    assert sorted((r["algorithm"], r["seed"]) for r in runs) == [("asgd", 1), ("asgd", 2), ("dc-asgd-a", 1), ("dc-asgd-a", 2)]
    # Two epochs at τ = 15 (asgd reaches about 26 %, dc-asgd-a 42 % here): learning, above chance.
    assert all(r["accuracy"] > 0.15 and r["staleness"]["max"] == 15 for r in runs), runs


def test_the_simulator_with_local_steps_and_a_straggler(tmp_path):
    command = readme("target/release/foresight-worker simulate --algorithms dc-asgd-a --delays straggler:")
    lines = run(command, scratch_repo(tmp_path)).stdout
    runs = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    assert [(r["algorithm"], r["delay"], r["local_steps"]) for r in runs] == [("dc-asgd-a", "straggler:4:3", 10)], runs
    # Worker 3's pseudo-gradients arrive 9 versions stale (three rounds of the others'); each
    # point of the curve says when, and the model learnt.
    assert runs[0]["staleness"]["max"] == 9 and runs[0]["accuracy"] > 0.5, runs
    assert all(p["time"] > 0 for p in runs[0]["curve"]), runs[0]["curve"]


def test_the_parameter_server_on_its_own(tmp_path):
    cwd = scratch_repo(tmp_path)
    help_text = run(readme("target/release/foresight-ps --help"), cwd).stdout
    assert "FORESIGHT_ALGORITHM" in help_text

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    env["FORESIGHT_PS_LISTEN"] = f"127.0.0.1:{port}"
    ps = subprocess.Popen(
        ["bash", "-c", readme("FORESIGHT_TOKEN=s3cret target/release/foresight-ps")],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": "Bearer s3cret"}
                )
                status = json.loads(urllib.request.urlopen(request, timeout=1).read())
                break
            except OSError:
                assert ps.poll() is None and time.monotonic() < deadline, ps.stdout.read()
                time.sleep(0.1)
        assert status["algorithm"] == "dc-asgd-a" and status["workers_expected"] == 8, status
    finally:
        os.killpg(ps.pid, signal.SIGTERM)
        ps.wait(timeout=30)
    assert (cwd / "out/ps-checkpoints").is_dir(), "the PS made its --checkpoint-dir"


def test_the_operator_help(tmp_path):
    """`foresight operator --help` (the README names it for every flag and its environment variable)."""
    printed = run("target/release/" + readme("foresight operator --help"), scratch_repo(tmp_path)).stdout
    assert "--kubeconfig" in printed and "--token-key" in printed and "[env: " in printed, printed


# The sh commands that the tests above run (test_every_readme_command_is_run_by_a_test checks
# that nothing else is left).
RUN_HERE = {
    readme("target/release/foresight run examples/mnist-dcasgd.yaml"),
    readme("target/release/foresight-worker simulate --algorithms asgd"),
    readme("target/release/foresight-worker simulate --algorithms dc-asgd-a --delays trace:"),
    readme("target/release/foresight-worker simulate --algorithms dc-asgd-a --delays straggler:"),
    readme("FORESIGHT_TOKEN=s3cret target/release/foresight-ps"),
    readme("target/release/foresight-ps --help"),
}
