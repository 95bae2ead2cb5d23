"""A real `foresight-ps` on loopback for each test, and the package's state reset around it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FORESIGHT_BIN_DIR", ROOT / "target" / "debug"))
TOKEN = "test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ParameterServer:
    def __init__(self, tmp: Path, **settings: object) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
        env.update(
            FORESIGHT_PS_LISTEN=f"127.0.0.1:{self.port}",
            FORESIGHT_TOKEN=TOKEN,
            FORESIGHT_CHECKPOINT_DIR=str(tmp / "checkpoints"),
            FORESIGHT_OUTPUT_DIR=str(tmp / "output"),
        )
        env.update({f"FORESIGHT_{k.upper()}": str(v) for k, v in settings.items()})
        self.log = open(tmp / "ps.log", "wb")
        self.proc = subprocess.Popen([str(BIN / "foresight-ps")], env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"foresight-ps did not start: {(tmp / 'ps.log').read_text()}")
                time.sleep(0.05)

    def status(self) -> dict:
        req = urllib.request.Request(f"{self.url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        return json.loads(urllib.request.urlopen(req, timeout=5).read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def ps_factory(tmp_path):
    started: list[ParameterServer] = []

    def start(**settings: object) -> ParameterServer:
        ps = ParameterServer(tmp_path, **settings)
        started.append(ps)
        return ps

    yield start
    for ps in started:
        ps.stop()


@pytest.fixture
def job_env(monkeypatch):
    """Sets a worker's environment for a PS and resets the package's per-process state."""
    import foresight

    def set_env(ps: ParameterServer, worker: int = 0, **extra: object) -> None:
        for k in list(os.environ):
            if k.startswith("FORESIGHT_"):
                monkeypatch.delenv(k)
        monkeypatch.setenv("FORESIGHT_PS_URL", ps.url)
        monkeypatch.setenv("FORESIGHT_WORKER_INDEX", str(worker))
        monkeypatch.setenv("FORESIGHT_TOKEN", TOKEN)
        monkeypatch.setenv("FORESIGHT_PS_DEADLINE_SECONDS", "10")
        for k, v in extra.items():
            monkeypatch.setenv(f"FORESIGHT_{k.upper()}", str(v))
        foresight._job = None

    yield set_env
    foresight._job = None
