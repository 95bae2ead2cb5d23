"""A real `foresight-ps` on loopback for each test, and the package's state reset around it."""

from __future__ import annotations

import json
import os
import socket
import ssl
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


def ca_signed_cert(d: Path) -> tuple[Path, Path, Path]:
    """A certificate for 127.0.0.1 signed by a CA of its own (openssl): cert, key and the CA's."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-days", "1", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-new", *ec, "-subj", "/CN=localhost", "-keyout", "key.pem", "-out", "leaf.csr")
    (d / "leaf.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "2",
        "-days", "1", "-extfile", "leaf.ext", "-out", "cert.pem")  # fmt: skip
    return d / "cert.pem", d / "key.pem", d / "ca.pem"


class ParameterServer:
    def __init__(self, tmp: Path, tls: tuple[Path, Path, Path] | None = None, **settings: object) -> None:
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        # urllib's requests to it trust the CA that signed its certificate.
        self.ssl = ssl.create_default_context(cafile=str(tls[2])) if tls else None
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
        env.update(
            FORESIGHT_PS_LISTEN=f"127.0.0.1:{self.port}",
            FORESIGHT_TOKEN=TOKEN,
            FORESIGHT_CHECKPOINT_DIR=str(tmp / "checkpoints"),
            FORESIGHT_OUTPUT_DIR=str(tmp / "output"),
        )
        if tls:
            env.update(FORESIGHT_TLS_CERT=str(tls[0]), FORESIGHT_TLS_KEY=str(tls[1]))
        env.update({f"FORESIGHT_{k.upper()}": str(v) for k, v in settings.items()})
        self.log = open(tmp / "ps.log", "wb")
        self.proc = subprocess.Popen([str(BIN / "foresight-ps")], env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1, context=self.ssl).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"foresight-ps did not start: {(tmp / 'ps.log').read_text()}")
                time.sleep(0.05)

    def status(self) -> dict:
        req = urllib.request.Request(f"{self.url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        return json.loads(urllib.request.urlopen(req, timeout=5, context=self.ssl).read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def ps_factory(tmp_path):
    started: list[ParameterServer] = []

    def start(tls: tuple[Path, Path, Path] | None = None, **settings: object) -> ParameterServer:
        ps = ParameterServer(tmp_path, tls, **settings)
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
