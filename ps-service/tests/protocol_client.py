#!/usr/bin/env python3
"""A Foresight PS client written from docs/protocol.md alone, with the Python standard library.

It proves the protocol document is enough to write a worker in another language: it registers
a model, pulls, pushes F32, BF16 and F16 gradients, retries a push (seq idempotency), triggers
the documented refusals and checks their status and `reason`, long-polls, reports, reads
/v1/status and /metrics, and finalizes. It speaks HTTP/1.1 (http.client), one connection per
request.

Usage:
    python3 protocol_client.py BASE_URL TOKEN
    e.g. python3 protocol_client.py http://127.0.0.1:8080 secret

The PS must be fresh (no model registered, nothing restored from a checkpoint), asynchronous
(asgd, dc-asgd-c or dc-asgd-a; the numeric checks assume the default weight decay and momentum
of 0) and have at least 2 workers; e.g.
    foresight-ps --listen 127.0.0.1:8080 --workers 2 --token secret --algorithm dc-asgd-a

Prints one line per check and exits non-zero on the first failure.
"""

import http.client
import json
import re
import socket
import struct
import sys
import time
import urllib.parse

VERSION_HEADER = "x-foresight-version"


# ---------------------------------------------------------------------------------------------
# Reporting


class CheckFailed(Exception):
    pass


def ok(name):
    print(f"ok    {name}", flush=True)


def check(name, cond, detail=""):
    if not cond:
        raise CheckFailed(f"{name}: {detail}" if detail else name)
    ok(name)


# ---------------------------------------------------------------------------------------------
# Numbers: f32, bf16 (round to nearest even), f16


def f32(x):
    """Rounds a Python float to the nearest float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_to_bf16_bits(x):
    """Upper 16 bits of the float32 bit pattern, rounded to nearest, ties to even."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF):
        return ((b >> 16) & 0x8000) | 0x7FC0  # a quiet NaN keeps its sign
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def bf16_bits_to_f32(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}


def pack_values(dtype, values):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F64":
        return struct.pack(f"<{len(values)}d", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    if dtype == "BF16":
        return struct.pack(f"<{len(values)}H", *(f32_to_bf16_bits(v) for v in values))
    raise ValueError(dtype)


def unpack_values(dtype, data):
    n = len(data) // DTYPE_SIZE[dtype]
    if dtype == "F32":
        return list(struct.unpack(f"<{n}f", data))
    if dtype == "F16":
        return list(struct.unpack(f"<{n}e", data))
    if dtype == "BF16":
        return [bf16_bits_to_f32(h) for h in struct.unpack(f"<{n}H", data)]
    raise ValueError(dtype)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------------------------------
# safetensors (docs/protocol.md §4)


def encode(tensors, metadata=None):
    """tensors: [(name, shape, dtype, values)] in the order they go into the data region."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    data = b""
    for name, shape, dtype, values in tensors:
        raw = pack_values(dtype, values)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # pad so that the data region is 8-byte aligned
    return struct.pack("<Q", len(text)) + text + data


def decode(body):
    """Returns (tensors in data-offset order as [(name, shape, dtype, values)], metadata, header_len)."""
    if len(body) < 8:
        raise ValueError("body shorter than 8 bytes")
    (n,) = struct.unpack("<Q", body[:8])
    if 8 + n > len(body):
        raise ValueError("header longer than the body")
    header = json.loads(body[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", None)
    data = body[8 + n :]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    tensors, end = [], 0
    for name, info in entries:
        begin, stop = info["data_offsets"]
        if begin != end:
            raise ValueError(f"tensor {name} does not start where the previous one ended")
        if stop - begin != numel(info["shape"]) * DTYPE_SIZE[info["dtype"]]:
            raise ValueError(f"tensor {name} has the wrong byte length")
        tensors.append((name, info["shape"], info["dtype"], unpack_values(info["dtype"], data[begin:stop])))
        end = stop
    if end != len(data):
        raise ValueError("data region has trailing bytes")
    return tensors, metadata, n


# ---------------------------------------------------------------------------------------------
# HTTP/1.1


class Response:
    def __init__(self, status, headers, body, elapsed):
        self.status = status
        self.headers = headers
        self.body = body
        self.elapsed = elapsed

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def version(self):
        v = self.headers.get(VERSION_HEADER)
        return int(v) if v is not None else None

    def describe(self):
        return f"HTTP {self.status} {self.body[:300]!r}"


class Ps:
    def __init__(self, base, token):
        u = urllib.parse.urlsplit(base)
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"base URL must be http:// or https://, got {base!r}")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.token = token

    def request(self, method, path, body=None, auth=True, token=None, timeout=60):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        headers = {}
        if auth:
            headers["Authorization"] = f"Bearer {token if token is not None else self.token}"
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        started = time.monotonic()
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            return Response(r.status, hdrs, data, time.monotonic() - started)
        finally:
            conn.close()

    def raw_headers_only(self, request_head, timeout=10):
        """Sends only a request head over a raw socket and reads the answer (for a body the
        server refuses by its declared length alone)."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            s.sendall(request_head)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            head, _, rest = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            hdrs = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            length = int(hdrs.get("content-length", "0"))
            while len(rest) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            return Response(status, hdrs, rest[:length], 0.0)

    # The protocol's endpoints.
    def register(self, body):
        return self.request("PUT", "/v1/model", body)

    def pull(self, worker, min_version=None, wait_ms=None):
        q = {"worker": worker}
        if min_version is not None:
            q["min_version"] = min_version
        if wait_ms is not None:
            q["wait_ms"] = wait_ms
        return self.request("GET", "/v1/model?" + urllib.parse.urlencode(q))

    def push(self, body, auth=True, **query):
        return self.request("POST", "/v1/gradients?" + urllib.parse.urlencode(query), body, auth=auth)

    def report(self, obj):
        return self.request("POST", "/v1/report", json.dumps(obj).encode())

    def status(self):
        return self.request("GET", "/v1/status")

    def finalize(self):
        return self.request("POST", "/v1/finalize")


# ---------------------------------------------------------------------------------------------
# Check helpers


def expect_error(name, r, status, reason):
    if r.status != status:
        raise CheckFailed(f"{name}: expected HTTP {status} {reason}, got {r.describe()}")
    try:
        body = r.json()
    except ValueError:
        raise CheckFailed(f"{name}: error body is not JSON: {r.body[:200]!r}")
    if body.get("reason") != reason or not isinstance(body.get("error"), str) or not body["error"]:
        raise CheckFailed(f"{name}: expected reason {reason!r} with a message, got {body}")
    ok(f"{name} -> {status} {reason}")


def expect_push(name, r, version, staleness, applied=True, replayed=False):
    if r.status != 200:
        raise CheckFailed(f"{name}: expected HTTP 200, got {r.describe()}")
    a = r.json()
    want = {"version": version, "staleness": staleness, "applied": applied, "replayed": replayed}
    got = {k: a.get(k) for k in want}
    if got != want:
        raise CheckFailed(f"{name}: expected {want}, got {a}")
    if r.version() != version:
        raise CheckFailed(f"{name}: {VERSION_HEADER} is {r.headers.get(VERSION_HEADER)!r}, expected {version}")
    lr = a.get("learning_rate")
    if not isinstance(lr, (int, float)) or not lr > 0:
        raise CheckFailed(f"{name}: learning_rate {lr!r} is not a positive number")
    ok(f"{name} -> version {version}, staleness {staleness}, applied={applied}, replayed={replayed}")
    return a


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def flat(tensors):
    return [v for _, _, _, vals in tensors for v in vals]


def sgd_step(w, lr, g):
    """w - lr*g in float32 arithmetic (the delay-compensation term is 0 when w == w_bak)."""
    return [f32(wi - f32(f32(lr) * gi)) for wi, gi in zip(w, g)]


def parse_metrics(text):
    """Prometheus text -> {(name, frozenset(labels)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


# ---------------------------------------------------------------------------------------------
# The scenario


def run(ps):
    rejected = {}  # reason -> how many pushes this script got refused with it

    def refused_push(name, r, status, reason):
        expect_error(name, r, status, reason)
        rejected[reason] = rejected.get(reason, 0) + 1

    # Local self-checks of the encoders (no server involved).
    check("bf16 rounds to nearest even", [f32_to_bf16_bits(x) for x in (1.0, 1.00390625, 1.01171875, -2.0)]
          == [0x3F80, 0x3F80, 0x3F82, 0xC000])

    # --- Open endpoints and auth -------------------------------------------------------------
    r = ps.request("GET", "/healthz", auth=False)
    check("GET /healthz without a token -> 200 ok", r.status == 200 and r.body == b"ok", r.describe())
    r = ps.request("GET", "/readyz", auth=False)
    check("GET /readyz without a token -> 200 ready", r.status == 200 and r.body == b"ready", r.describe())
    expect_error("GET /v1/status without a token", ps.request("GET", "/v1/status", auth=False), 401, "unauthorized")
    expect_error("GET /v1/status with a wrong token", ps.request("GET", "/v1/status", token="wrong"),
                 401, "unauthorized")

    # --- Before registration -------------------------------------------------------------------
    r = ps.status()
    check("GET /v1/status -> 200", r.status == 200, r.describe())
    st = r.json()
    check("status: fresh PS, nothing registered", st.get("registered") is False,
          f"this script needs a fresh PS; status says {st}")
    workers = st.get("workers_expected")
    algorithm = st.get("algorithm")
    check("status: at least 2 workers", isinstance(workers, int) and workers >= 2, f"workers_expected={workers}")
    check("status: an asynchronous algorithm", algorithm in ("asgd", "dc-asgd-c", "dc-asgd-a"),
          f"algorithm={algorithm!r}")
    delay_compensated = algorithm.startswith("dc-")

    # A 2-tensor model. Layout order (data-offset order) is weight, bias: the reverse of the
    # alphabetical order in which the PS writes its JSON keys.
    w0 = [0.5, -1.0, 1.5, 2.0, -0.25, 0.75]
    b0 = [0.125, -0.5, 1.0]
    model = [("weight", [2, 3], "F32", w0), ("bias", [3], "F32", b0)]
    grad_shapes = [("weight", [2, 3]), ("bias", [3])]

    def gradient(dtype, wv, bv):
        return encode([("weight", [2, 3], dtype, wv), ("bias", [3], dtype, bv)])

    g1w, g1b = [0.1, 0.2, -0.3, 0.4, 0.5, -0.6], [1.0, -1.0, 0.5]
    body_f32 = gradient("F32", g1w, g1b)

    expect_error("pull before registration", ps.pull(0), 409, "not_registered")
    refused_push("push before registration", ps.push(body_f32, worker=0, version=0, seq=1), 409, "not_registered")
    refused_push("push without a token", ps.push(body_f32, auth=False, worker=0, version=0, seq=1),
                 401, "unauthorized")

    # --- Register -------------------------------------------------------------------------------
    r = ps.register(encode(model, metadata={"note": "registered by protocol_client.py"}))
    check("PUT /v1/model -> 201", r.status == 201, r.describe())
    check("PUT /v1/model: x-foresight-version 0", r.version() == 0, str(r.headers))
    check("PUT /v1/model: body", r.json() == {"version": 0, "parameters": 9, "tensors": 2}, r.describe())
    expect_error("second PUT /v1/model", ps.register(encode(model)), 409, "already_registered")

    # --- Pull as worker 0 -----------------------------------------------------------------------
    r = ps.pull(0)
    check("pull worker 0 -> 200", r.status == 200, r.describe())
    check("pull: x-foresight-version 0", r.version() == 0, str(r.headers))
    check("pull: content-type application/octet-stream",
          r.headers.get("content-type") == "application/octet-stream", str(r.headers))
    tensors, meta, n = decode(r.body)
    check("pull: header padded to a multiple of 8", (8 + n) % 8 == 0, f"8 + {n}")
    check("pull: no __metadata__", meta is None, str(meta))
    check("pull: tensors in layout (data-offset) order, F32, registered shapes",
          [(t[0], t[1], t[2]) for t in tensors] == [("weight", [2, 3], "F32"), ("bias", [3], "F32")],
          str([(t[0], t[1], t[2]) for t in tensors]))
    check("pull: values are the registered ones", flat(tensors) == w0 + b0, str(flat(tensors)))
    w = flat(tensors)

    # --- Push F32 -------------------------------------------------------------------------------
    a = expect_push("push F32 (worker 0, version 0, seq 1)",
                    ps.push(body_f32, worker=0, version=0, seq=1, epoch=0.01), version=1, staleness=0)
    lr = a["learning_rate"]
    r = ps.pull(0)
    check("pull after the F32 push: version 1", r.status == 200 and r.version() == 1, r.describe())
    got = flat(decode(r.body)[0])
    want = sgd_step(w, lr, g1w + g1b)
    check("model after the F32 push = w - lr*g", all(close(x, y) for x, y in zip(got, want)), f"{got} vs {want}")
    w = got

    # --- Push BF16 ------------------------------------------------------------------------------
    g2w, g2b = [0.3, -0.7, 1 / 3, 0.01, -2.5, 0.6], [0.2, 0.9, -0.15]
    body_bf16 = gradient("BF16", g2w, g2b)
    expect_push("push BF16 (worker 0, version 1, seq 2)",
                ps.push(body_bf16, worker=0, version=1, seq=2, epoch=0.02), version=2, staleness=0)

    # --- Retry the same seq: a replay ------------------------------------------------------------
    expect_push("retry of seq 2 is a replay", ps.push(body_bf16, worker=0, version=1, seq=2, epoch=0.02),
                version=2, staleness=0, replayed=True)
    st = ps.status().json()
    check("status after the replay: version still 2", st.get("version") == 2, f"version={st.get('version')}")
    r = ps.pull(0)
    check("pull after the replay: version 2", r.status == 200 and r.version() == 2, r.describe())
    got = flat(decode(r.body)[0])
    g2_widened = [bf16_bits_to_f32(f32_to_bf16_bits(v)) for v in g2w + g2b]
    want = sgd_step(w, lr, g2_widened)
    check("model after BF16 push + replay = one update with the bf16-rounded gradient",
          all(close(x, y) for x, y in zip(got, want)), f"{got} vs {want}")
    w = got

    # --- Refusals ------------------------------------------------------------------------------
    refused_push("lower seq", ps.push(body_f32, worker=0, version=2, seq=1), 409, "stale_seq")
    refused_push("unknown worker", ps.push(body_f32, worker=workers, version=2, seq=10), 400, "unknown_worker")
    bad_shape = encode([("weight", [3, 2], "F32", g1w), ("bias", [3], "F32", g1b)])
    refused_push("shape mismatch ([3,2] for [2,3])", ps.push(bad_shape, worker=0, version=2, seq=10),
                 422, "shape_mismatch")
    nan_body = gradient("F32", g1w, [1.0, float("nan"), 0.5])
    refused_push("NaN in a gradient", ps.push(nan_body, worker=0, version=2, seq=10), 422, "non_finite")
    refused_push("truncated body", ps.push(body_f32[:-3], worker=0, version=2, seq=10), 400, "malformed_body")
    refused_push("future version", ps.push(body_f32, worker=0, version=102, seq=10), 400, "future_version")
    missing = encode([("weight", [2, 3], "F32", g1w)])
    refused_push("missing tensor", ps.push(missing, worker=0, version=2, seq=10), 422, "layout_mismatch")
    refused_push("F64 gradient", ps.push(gradient("F64", g1w, g1b), worker=0, version=2, seq=10),
                 422, "dtype_mismatch")
    refused_push("missing seq", ps.request("POST", "/v1/gradients?worker=0&version=2", body_f32),
                 400, "bad_request")
    head = (f"POST /v1/gradients?worker=0&version=2&seq=10 HTTP/1.1\r\nHost: {ps.host}:{ps.port}\r\n"
            f"Authorization: Bearer {ps.token}\r\nContent-Length: {1 << 62}\r\n\r\n").encode()
    if ps.https:
        ok("declared Content-Length over the limit: skipped over https")
    else:
        refused_push("declared Content-Length over the limit", ps.raw_headers_only(head), 413, "body_too_large")
    if delay_compensated:
        # Worker 1 never pulled: its w_bak is the version-0 model, so a version-2 gradient is refused.
        refused_push("worker 1 pushes for a version it did not pull", ps.push(body_f32, worker=1, version=2, seq=1),
                     409, "pull_required")
    st = ps.status().json()
    check("refusals did not change the model version", st.get("version") == 2, f"version={st.get('version')}")

    # --- A refused seq can be used again; push F16 ------------------------------------------------
    g3w, g3b = [0.5, 0.25, -0.125, 1.0, -1.0, 0.0], [0.75, -0.375, 2.0]
    expect_push("push F16 (worker 0, version 2, seq 10)",
                ps.push(gradient("F16", g3w, g3b), worker=0, version=2, seq=10, epoch=0.03), version=3, staleness=0)

    # --- Long-poll -----------------------------------------------------------------------------
    r = ps.pull(0, min_version=4, wait_ms=300)
    check("long-poll for version 4 -> 204 after the wait",
          r.status == 204 and r.body == b"" and r.elapsed >= 0.25, f"{r.describe()} after {r.elapsed:.3f}s")
    check("204 carries x-foresight-version 3", r.version() == 3, str(r.headers))
    # A wait far longer than any answer takes, so that "at once" is told from "after the wait"
    # however slow the machine is.
    r = ps.pull(0, min_version=3, wait_ms=40000)
    check("long-poll for a version already reached -> 200 at once",
          r.status == 200 and r.version() == 3 and r.elapsed < 20.0, f"{r.describe()} after {r.elapsed:.3f}s")
    got = flat(decode(r.body)[0])
    want = sgd_step(w, lr, g3w + g3b)
    check("model after the F16 push = w - lr*g", all(close(x, y) for x, y in zip(got, want)), f"{got} vs {want}")

    # --- Report ----------------------------------------------------------------------------------
    rep = {"worker": 0, "step": 3, "epoch": 0.03, "loss": 2.25, "accuracy": 0.125, "samples_per_second": 640.0}
    r = ps.report(rep)
    check("POST /v1/report -> 204", r.status == 204 and r.body == b"", r.describe())
    expect_error("report with accuracy 1.5", ps.report(dict(rep, accuracy=1.5)), 400, "bad_request")
    expect_error("report with an unknown field", ps.report(dict(rep, lr=0.1)), 400, "bad_request")
    expect_error("report for an unknown worker", ps.report(dict(rep, worker=workers)), 400, "unknown_worker")

    # --- Status ----------------------------------------------------------------------------------
    r = ps.status()
    check("GET /v1/status -> 200 JSON", r.status == 200 and r.headers.get("content-type") == "application/json",
          r.describe())
    st = r.json()
    check("status: registered, version 3, not finalized, 9 parameters",
          (st.get("registered"), st.get("version"), st.get("finalized"), st.get("parameters")) == (True, 3, False, 9),
          str(st))
    check("status: reports[0] is the last report, reports[1] null",
          st.get("reports") == [rep] + [None] * (workers - 1), str(st.get("reports")))
    check("status: step, loss, accuracy, samples_per_second from the report",
          (st.get("step"), st.get("loss"), st.get("accuracy"), st.get("samples_per_second")) == (3, 2.25, 0.125, 640.0),
          str(st))
    w_st = st.get("workers") or []
    check("status: worker 0 pushed 3 times, last pulled version 3, last staleness 0",
          len(w_st) == workers and w_st[0].get("pushes") == 3 and w_st[0].get("pulled_version") == 3
          and w_st[0].get("last_staleness") == 0, str(w_st))
    check("status: worker 1 never pulled nor pushed",
          w_st[1] == {"generation": 0, "pulled_version": None, "pushes": 0, "last_staleness": None,
                      "mean_staleness": 0.0, "resume_step": None, "finished": False,
                      "silent": False}, str(w_st))
    check("status: worker 0's resume_step is its last accepted seq", w_st[0].get("resume_step") == 10, str(w_st))
    s = st.get("staleness") or {}
    check("status: staleness summary over 3 pushes, all tau = 0",
          s.get("count") == 3 and s.get("max") == 0 and s.get("zero_fraction") == 1.0, str(s))
    check("status: learning_rate is a positive number", isinstance(st.get("learning_rate"), float)
          and st["learning_rate"] > 0, str(st.get("learning_rate")))

    # --- Join: a new process of worker 1 -----------------------------------------------------------
    r = ps.request("POST", "/v1/join?worker=1")
    j = r.json() if r.status == 200 else {}
    heartbeat_ms = j.pop("heartbeat_ms", None)
    algorithm = j.pop("algorithm", None)
    check("POST /v1/join?worker=1 -> generation 1, nothing to resume, version 3",
          r.status == 200 and j == {"generation": 1, "resume_step": 0, "version": 3, "workers": 2}, r.describe())
    check("join: heartbeat_ms, how often to send POST /v1/heartbeat between exchanges, a positive integer",
          isinstance(heartbeat_ms, int) and heartbeat_ms > 0, str(heartbeat_ms))
    check("join: algorithm, the PS's update rule", algorithm == st.get("algorithm") and algorithm in
          ("sync", "asgd", "dc-asgd-c", "dc-asgd-a"), str(algorithm))
    r = ps.request("POST", "/v1/heartbeat?worker=1")
    check("POST /v1/heartbeat?worker=1 -> 204", r.status == 204, r.describe())
    refused_push("a push of generation 0 after the join", ps.push(body_f32, worker=1, version=3, seq=1, generation=0),
                 409, "superseded")
    refused_push("a generation the PS never handed out", ps.push(body_f32, worker=1, version=3, seq=1, generation=2),
                 409, "rejoin_required")
    expect_error("join of an unknown worker", ps.request("POST", "/v1/join?worker=2"), 400, "unknown_worker")
    check("the refusals changed nothing", ps.status().json().get("version") == 3)

    # --- Scaling: the job gets a third worker ------------------------------------------------------
    for bad in ["", "?count=0", "?count=1025", "?count=x"]:
        expect_error(f"PUT /v1/workers{bad}", ps.request("PUT", f"/v1/workers{bad}"), 400, "bad_request")
    check("refused counts changed nothing", ps.status().json().get("workers_expected") == 2)
    r = ps.request("PUT", "/v1/workers?count=3")
    check("PUT /v1/workers?count=3 -> 200 {workers: 3}", r.status == 200 and r.json() == {"workers": 3}, r.describe())
    r = ps.request("POST", "/v1/join?worker=2")
    check("worker 2 joins the scaled job", r.status == 200 and r.json().get("workers") == 3, r.describe())
    check("status: workers_expected follows", ps.status().json().get("workers_expected") == 3)

    # --- Finalize --------------------------------------------------------------------------------
    r = ps.finalize()
    check("POST /v1/finalize -> 200", r.status == 200, r.describe())
    fin = r.json()
    check("finalize: version 3 and a path (string or null)",
          fin.get("version") == 3 and (fin.get("path") is None or isinstance(fin.get("path"), str)), str(fin))
    r = ps.finalize()
    check("finalize again is idempotent", r.status == 200 and r.json().get("version") == 3, r.describe())
    refused_push("push after finalize", ps.push(body_f32, worker=0, version=3, seq=11), 409, "finalized")
    expect_push("retry of the last seq after finalize is still a replay",
                ps.push(gradient("F16", g3w, g3b), worker=0, version=2, seq=10), version=3, staleness=0, replayed=True)
    r = ps.pull(1)
    check("pull after finalize still works", r.status == 200 and r.version() == 3, r.describe())
    st = ps.status().json()
    check("status: finalized", st.get("finalized") is True and st.get("version") == 3, str(st))

    # --- Metrics ---------------------------------------------------------------------------------
    r = ps.request("GET", "/metrics", auth=False)
    check("GET /metrics without a token -> 200 text/plain",
          r.status == 200 and r.headers.get("content-type", "").startswith("text/plain"), r.describe())
    metrics = parse_metrics(r.body.decode("utf-8"))

    def value(name, **labels):
        found = [v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls)]
        return found[0] if found else None

    check("metrics: foresight_ps_gradients_rejected_total is exported",
          any(n == "foresight_ps_gradients_rejected_total" for n, _ in metrics), "no such series")
    for reason, count in sorted(rejected.items()):
        v = value("foresight_ps_gradients_rejected_total", reason=reason)
        check(f"metrics: rejected_total{{reason=\"{reason}\"}} = {count}", v == count, f"got {v}")
    check("metrics: foresight_ps_model_version = 3", value("foresight_ps_model_version") == 3,
          str(value("foresight_ps_model_version")))
    check("metrics: foresight_ps_updates_total = 3", value("foresight_ps_updates_total") == 3,
          str(value("foresight_ps_updates_total")))
    check("metrics: every series has job and namespace labels",
          all({"job", "namespace"} <= {k for k, _ in ls} for (n, ls) in metrics if n.startswith("foresight_ps_")),
          "a series lacks them")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ps = Ps(argv[1].rstrip("/"), argv[2])
    try:
        run(ps)
    except CheckFailed as e:
        print(f"FAIL  {e}", flush=True)
        return 1
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException) as e:
        print(f"FAIL  unexpected error: {type(e).__name__}: {e}", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
