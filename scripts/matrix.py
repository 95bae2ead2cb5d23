#!/usr/bin/env python3
"""`make matrix`: the conformance matrix. Real `foresight run` jobs over the parameter server's
configuration space, each with a fault injected for real (signals to the processes), each
checked against the same invariants; writes the table into docs/reliability.md.

Configuration space (LeNet-5 on MNIST-5k, 3 workers, --journal capture):
  algorithm   asgd, dc-asgd-a, dc-asgd-c, sync, sync with backupWorkers: 1, dc-asgd-a with maxStaleness: 4
  shards      parameterServer.replicas 1 or 3
  local       localSteps 1, fixed (8), adaptive (4 within [2, 16]; [8, 16] with long-block)
  push        gradientDtype f32, bf16, int8
  pull        pullDtype f32, int8
  workers     rust (the built-in LeNet-5 worker), python (examples/python/mnist.py), python-overlap
              (the same with FORESIGHT_OVERLAP=1: each exchange overlapped with the next step; the
              package refuses it with sync and with local steps, which python/tests checks, so
              those pairs are not runs)
  every       pushEvery = pullEvery = 1 or 2
  groups      none; or weightDecay 0.0005 with optimizer.parameterGroups (no weight decay on the
              biases, fc3 at half the learning rate)
  fault       none; worker-kill (SIGKILL a worker, `foresight run` starts it again); worker-stop
              (SIGSTOP a worker past the silence timeout, then SIGCONT); long-block (Rust workers'
              computation slowed 100× so that one block of 8 or more local steps outlasts the
              silence timeout, their exchanges not slowed); shard1-kill
              (SIGKILL PS shard 1 of 3); shard0-kill (SIGKILL PS shard 0, which restores its
              checkpoint); each once shard 0's journal holds 12 entries and worker 1 has pushed

Pairs that only refused configurations hold (localSteps with pushEvery > 1; sync or
maxStaleness on a sharded PS; dc-asgd-c with localSteps) get a refusal check each: `foresight
run` must refuse the job with a message naming the fields.

Invariants, each checked on every run from its own outputs:
  ends      the job ends (exit 0) within its bound (--bound seconds)
  accounted every push in each shard's journal is applied at most once and every refusal has a
            reason; a `sync` contribution is in exactly one applied round or counted dropped
  untorn    a push has the same fate (applied, or refused and why) on every shard; pushes lost
            in a PS shard's restart, and those on some shards only (`partial`, allowed only when
            a process was killed), are counted apart
  replay    `foresight replay` of every shard's journal reproduces its final checkpoint bit for bit
  alive     a worker in a block of local steps longer than the silence timeout is never marked
            silent once it has pushed (its heartbeats; before, it may still be starting); a
            worker stopped past it is (worker-stop)
  accuracy  the final model's held-out accuracy (summary.json) reaches --floor
  summary   summary.json exists and counts the restarts the fault caused

The combinations cover every pair of values (greedy pairwise covering, seeded); --quick runs
a subset in which every value appears at least once, with every refusal check (what `make test`
runs, on the debug binaries).

Usage: scripts/matrix.py [--quick] [--epochs 3] [--out out/matrix] [--doc docs/reliability.md]
                         [--bin target/release] [--only N,M] [--seed 1]
"""

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos import children

REPO = Path(__file__).resolve().parent.parent

SPACE = {
    "algorithm": ["asgd", "dc-asgd-a", "dc-asgd-c", "sync", "sync-backup", "dc-asgd-a-maxstale"],
    "shards": [1, 3],
    "local": ["1", "fixed", "adaptive"],
    "push": ["f32", "bf16", "int8"],
    "pull": ["f32", "int8"],
    "workers": ["rust", "python", "python-overlap"],
    "every": [1, 2],
    "groups": ["none", "bias-fc3"],
    "fault": ["none", "worker-kill", "worker-stop", "long-block", "shard1-kill", "shard0-kill"],
}
WORKERS = 3
# Seconds a stopped worker stays stopped, and the silence timeout it outlasts.
SILENCE_S = 2
STOP_S = 5


def refusal(c):
    """The fields `foresight run` must name when it refuses `c`, or None when `c` is valid."""
    if c["local"] != "1" and c["every"] > 1:
        return ["localSteps"]
    if c["algorithm"] == "dc-asgd-c" and c["local"] != "1":
        return ["optimizer.algorithm", "localSteps"]
    if c["algorithm"] in ("sync", "sync-backup") and c["shards"] > 1:
        return ["optimizer.algorithm", "parameterServer.replicas"]
    if c["algorithm"] == "dc-asgd-a-maxstale" and c["shards"] > 1:
        return ["optimizer.maxStaleness", "parameterServer.replicas"]
    return None


def runnable(c):
    """Whether a run can be made of `c` at all: a shard-1 kill needs a shard 1, a long block
    needs local steps. And a long block is the Rust worker's: the Python example evaluates its
    copy at every epoch's end, a pause without steps that is silence by design (heartbeats come
    from the training loop); the package's heartbeats in a block are python/tests/test_cadence.py's."""
    if c["fault"] == "shard1-kill" and c["shards"] == 1:
        return False
    if c["workers"] == "python-overlap" and (c["algorithm"].startswith("sync") or c["local"] != "1"):
        return False
    return c["fault"] != "long-block" or (c["local"] != "1" and c["workers"] == "rust")


def covering(seed, pairwise):
    """Greedy covering of every pair (or every single value) of SPACE's values by valid
    combinations, then one refusal check for each pair that only invalid combinations hold."""
    names = list(SPACE)
    rng = random.Random(seed)
    runnable_ = [dict(zip(names, vals)) for vals in itertools.product(*SPACE.values())]
    runnable_ = [c for c in runnable_ if runnable(c)]
    every = [c for c in runnable_ if refusal(c) is None]

    def pairs(c):
        return {((a, c[a]), (b, c[b])) for a, b in itertools.combinations(names, 2)}

    def units(c):
        return pairs(c) if pairwise else {(a, c[a]) for a in names}

    wanted = set().union(*(units(c) for c in every))
    # Pairs that only refused combinations hold (whatever the mode): one check each.
    refused = set().union(*(pairs(c) for c in runnable_)) - set().union(*(pairs(c) for c in every))
    checks = []
    for unit in sorted(refused, key=str):
        if not any(unit in pairs(c) for c in checks):
            checks.append(next(c for c in runnable_ if unit in pairs(c) and refusal(c)))
    chosen = []
    while wanted:
        sample = rng.sample(every, min(400, len(every)))
        best = max(sample, key=lambda c: len(units(c) & wanted))
        if not units(best) & wanted:
            # The sample missed what is left: take a combination that covers it.
            unit = next(iter(wanted))
            best = next(c for c in every if unit in units(c))
        chosen.append(best)
        wanted -= units(best)
    return chosen + checks


def job_yaml(name, c, epochs):
    algorithm = {"sync-backup": "sync", "dc-asgd-a-maxstale": "dc-asgd-a"}.get(c["algorithm"], c["algorithm"])
    opt = [f"algorithm: {algorithm}"]
    if c["algorithm"] == "sync-backup":
        opt.append("backupWorkers: 1")
    if c["algorithm"] == "dc-asgd-a-maxstale":
        opt.append("maxStaleness: 4")
    if algorithm == "sync":
        opt.append(f"syncRoundTimeoutSeconds: {SILENCE_S}")
    if c["local"] == "fixed":
        opt.append("localSteps: 8")
    elif c["local"] == "adaptive" and c["fault"] == "long-block":
        # A slowed worker's exchange is short next to its work, so the PS would advise the
        # fewest steps: the least it may advise is a block past the silence timeout.
        opt.append("localSteps: 8")
        opt.append("adaptiveLocalSteps: {min: 8, max: 16}")
    elif c["local"] == "adaptive":
        opt.append("localSteps: 4")
        opt.append("adaptiveLocalSteps: {min: 2, max: 16}")
    if c["every"] > 1:
        opt += [f"pushEvery: {c['every']}", f"pullEvery: {c['every']}"]
    opt += [f"gradientDtype: {c['push']}", f"pullDtype: {c['pull']}"]
    if c["groups"] == "bias-fc3":
        opt.append("weightDecay: 0.0005")
        opt.append('parameterGroups: [{names: ["bias$"], weightDecay: 0}, {names: ["^fc3[.]"], learningRateScale: 0.5}]')
    lr = 0.5 if c["local"] != "1" else 0.05
    workers = f"replicas: {WORKERS}"
    model = "  model: {name: lenet5}\n"
    if c["workers"].startswith("python"):
        workers += ", command: [python, examples/python/mnist.py]"
        model = ""
    return (
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"{model}"
        "  dataset: {format: csv, path: data/mnist5k, holdout: 0.2}\n"
        f"  training: {{epochs: {epochs}, batchSize: 32, learningRate: {lr}, seed: 1}}\n"
        f"  optimizer: {{{', '.join(opt)}}}\n"
        f"  parameterServer: {{replicas: {c['shards']}, checkpoint: {{intervalSeconds: 2}}}}\n"
        f"  workers: {{{workers}}}\n"
        "  runPolicy: {backoffLimit: 20}\n"
    )


def find(parent, key, value):
    """The child of `parent` whose environment has `key`=`value`."""
    for pid, env in children(parent).items():
        if env.get(key) == value:
            return pid
    return None


# Entries in shard 0's journal before the fault: early enough that every worker is still
# training in the shortest runs (local steps: about 50 entries in all).
INJECT_AFTER = 12


def ready_for_fault(journal):
    """INJECT_AFTER entries, worker 1 (the one a worker fault hits) among those that pushed."""
    try:
        lines = [json.loads(l) for l in journal.read_text().splitlines() if l.endswith("}")]
    except OSError:
        return False
    return len(lines) >= INJECT_AFTER and any(
        l["kind"] in ("applied", "contributed") and l["worker"] == 1 for l in lines)


def inject(fault, proc, journal, events):
    """Once `journal` (shard 0's) is `ready_for_fault`, injects `fault` into the run's
    processes."""
    while not ready_for_fault(journal):
        if proc.wait_until(time.time() - proc.t0 + 0.2):
            return
    target = {
        "worker-kill": ("FORESIGHT_WORKER_INDEX", "1", signal.SIGKILL),
        "worker-stop": ("FORESIGHT_WORKER_INDEX", "1", signal.SIGSTOP),
        "shard1-kill": ("FORESIGHT_PS_SHARD", "1", signal.SIGKILL),
        "shard0-kill": ("FORESIGHT_PS_SHARD", "0", signal.SIGKILL),
    }.get(fault)
    if target is None:
        return
    key, value, sig = target
    pid = find(proc.p.pid, key, value)
    if pid is None:
        events.append(f"{fault}: no process found")
        return
    os.kill(pid, sig)
    events.append(f"{fault} at {time.time() - proc.t0:.1f}s")
    if sig == signal.SIGSTOP:
        time.sleep(STOP_S)
        os.kill(pid, signal.SIGCONT)
        events.append(f"SIGCONT after {STOP_S}s")


class Proc:
    def __init__(self, cmd, env, log):
        self.t0 = time.time()
        self.log = open(log, "w")
        self.p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_until(self, t):
        """Sleeps until `t` seconds after the start; True if the run ended first."""
        try:
            self.p.wait(timeout=max(0.0, self.t0 + t - time.time()))
            return True
        except subprocess.TimeoutExpired:
            return False


def shard_dirs(out, shards):
    ckpt = out / "checkpoints"
    return [ckpt] if shards == 1 else [ckpt / f"shard-{i}" for i in range(shards)]


def journal_lines(journal_dir):
    return [json.loads(l) for l in (journal_dir / "journal.jsonl").read_text().splitlines() if l.endswith("}")]


# How a restarted PS process begins: from its checkpoint, or (none written yet) from a
# worker's copy. A round it had not closed is gone with the process either way.
RESTARTS = ("restored", "seeded")


def fates(journal_dir):
    """Per push (worker, generation, seq) on one shard: its fate, and any broken accounting."""
    lines = journal_lines(journal_dir)
    fate, broken, pending = {}, [], {}
    for i, l in enumerate(lines):
        k = l["kind"]
        key = (l.get("worker"), l.get("generation"), l.get("seq"))
        if k == "applied":
            if fate.get(key) == "applied":
                broken.append(f"{key} applied twice")
            # Lost when a later process took a version below it (its checkpoint, or a worker's
            # copy when it had none).
            later = [l2["version"] for l2 in lines[i + 1:] if l2["kind"] == "started" and l2["how"] in RESTARTS]
            fate[key] = "lost" if any(v < l["version"] for v in later) else "applied"
        elif k == "contributed":
            pending.setdefault(l["round"], []).append(key)
        elif k == "round":
            for key2 in pending.pop(l["version"] - 1, []):
                if key2[0] not in l["workers"]:
                    broken.append(f"{key2} contributed to round {l['version']} but not in it")
                if fate.get(key2) == "applied":
                    broken.append(f"{key2} applied twice")
                fate[key2] = "applied"
        elif k == "refused":
            if not l.get("reason"):
                broken.append(f"{key} refused without a reason")
            fate.setdefault(key, "refused:" + l["reason"])
        elif k == "started" and l["how"] in RESTARTS:
            for keys in pending.values():
                for key2 in keys:
                    fate[key2] = "dropped:restart"
            pending.clear()
    for keys in pending.values():
        for key2 in keys:
            fate.setdefault(key2, "dropped:finalized")
    return fate, broken


def check(c, out, rc, seconds, bound, floor, shards):
    """The invariants of one finished run: {name: (ok, detail)}."""
    inv = {}
    inv["ends"] = (rc == 0 and seconds <= bound, f"exit {rc} in {seconds:.0f}s (bound {bound}s)")
    dirs = shard_dirs(out, shards)
    per_shard, broken = [], []
    for d in dirs:
        try:
            f, b = fates(d)
        except OSError as e:
            f, b = {}, [str(e)]
        per_shard.append(f)
        broken += b
    inv["accounted"] = (not broken, "; ".join(broken[:3]) or
                        f"{sum(v == 'applied' for v in per_shard[0].values())} pushes applied on shard 0")
    keys = set().union(*(f.keys() for f in per_shard))
    # A PS shard that restarted lost the updates its checkpoint and the workers' copies lacked,
    # and refused the pushes in flight on the model it no longer had: counted as lost in the
    # restart, not as torn.
    restart = {"lost", "dropped:restart"}
    if c["fault"] in ("shard1-kill", "shard0-kill"):
        restart |= {f"refused:{r}" for r in ("not_registered", "seeding", "pull_required", "rejoin_required")}
    fates_of = {k: [f.get(k) for f in per_shard] for k in keys}
    lost = [k for k, fs in fates_of.items() if restart & set(fs)]
    torn = [k for k, fs in fates_of.items() if None not in fs and len(set(fs)) > 1 and not restart & set(fs)]
    partial = [k for k, fs in fates_of.items() if None in fs and not restart & set(fs)]
    # Only a process that died can leave a push on some shards only.
    died = c["fault"] in ("worker-kill", "shard1-kill", "shard0-kill")
    dropped = {}
    for fs in fates_of.values():
        for v in {v for v in fs if v not in (None, "applied")}:
            dropped[v] = dropped.get(v, 0) + 1
    example = sorted(torn or partial, key=str)[:1]
    inv["untorn"] = (not torn and (died or not partial),
                     f"{len(torn)} torn, {len(partial)} partial, {len(lost)} lost in a PS restart" +
                     "".join(f", e.g. {k}: {fates_of[k]}" for k in example))
    replays = []
    for d in dirs:
        r = subprocess.run([str(BIN / "foresight"), "replay", str(d)], capture_output=True, text=True)
        replays.append((r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]))
    inv["replay"] = (all(rc == 0 for rc, _ in replays), " | ".join(t[0] for _, t in replays))
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    acc = summary.get("accuracy") if summary else None
    inv["accuracy"] = (acc is not None and acc >= floor, f"{acc:.3f}" if acc is not None else "none")
    restarts = len(summary.get("restarts", [])) if summary else -1
    want = 1 if c["fault"] in ("worker-kill", "shard1-kill", "shard0-kill") else 0
    # A worker in a long block is alive (its heartbeats); one stopped past the timeout is not.
    # Counted once the worker has trained (its first push): a worker process that took longer
    # than the timeout to start (3 on 2 cores) is silent before it ever joined, rightly so.
    try:
        trained, silences = set(), 0
        for l in journal_lines(dirs[0]):
            if l["kind"] in ("applied", "contributed"):
                trained.add(l["worker"])
            elif l["kind"] == "silence" and l["silent"] and l["worker"] in trained:
                silences += 1
    except OSError:
        silences = -1
    if c["fault"] in ("long-block", "worker-stop"):
        want_silent = c["fault"] == "worker-stop"
        inv["alive"] = ((silences > 0) == want_silent, f"{silences} silence mark(s) on shard 0")
    inv["summary"] = (summary is not None and restarts == want, f"{restarts} restart(s), {want} caused")
    return inv, dropped


def run_one(i, c, args):
    name = f"m{i:02d}"
    out = Path(args.out) / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    job = out / "job.yaml"
    job.write_text(job_yaml(name, c, args.epochs))
    path = f"{REPO / '.venv/bin'}:{os.environ.get('PATH', '')}"
    env = dict(os.environ, PATH=path, FORESIGHT_WORKER_SILENCE_TIMEOUT=str(SILENCE_S), RUST_LOG="warn")
    env["FORESIGHT_OVERLAP"] = "1" if c["workers"] == "python-overlap" else "0"
    cmd = [str(BIN / "foresight"), "run", str(job), "--out", str(out), "--no-progress", "--journal", "capture"]
    if c["fault"] == "long-block":
        # Every step's work 100× slower (LeNet-5: about 0.7 s a step): a block of 8 local steps
        # or more lasts about 6 s, twice a 3 s silence timeout that a held-out evaluation (not
        # slowed) fits in.
        cmd += [arg for w in range(WORKERS) for arg in ("--slow-worker", f"{w}=100")]
        env["FORESIGHT_WORKER_SILENCE_TIMEOUT"] = "3"
    proc = Proc(cmd, env, out / "run.log")
    events = []
    journal = shard_dirs(out, c["shards"])[0] / "journal.jsonl"
    injector = threading.Thread(target=inject, args=(c["fault"], proc, journal, events), daemon=True)
    injector.start()
    try:
        rc = proc.p.wait(timeout=args.bound + 60)
    except subprocess.TimeoutExpired:
        proc.p.kill()
        rc = proc.p.wait()
    seconds = time.time() - proc.t0
    injector.join(timeout=STOP_S + 1)
    log = (out / "run.log").read_text(errors="replace")
    expected = refusal(c)
    if expected is not None:
        named = all(f in log for f in expected)
        inv = {"refused": (rc != 0 and named, f"exit {rc}; names {expected}: {named}")}
        return inv, {}, events, seconds
    inv, dropped = check(c, out, rc, seconds, args.bound, args.floor, c["shards"])
    if rc != 0:
        inv["ends"] = (False, inv["ends"][1] + ": " + log.strip().splitlines()[-1][:160] if log.strip() else "")
    return inv, dropped, events, seconds


def table(rows):
    names = list(SPACE)
    lines = ["| # | " + " | ".join(names) + " | invariants | dropped | s |",
             "|---|" + "---|" * len(names) + "---|---|---|"]
    for i, c, inv, dropped, seconds in rows:
        marks = " ".join(("✓ " if ok else "✗ ") + k for k, (ok, _) in inv.items())
        drops = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "—"
        lines.append(f"| {i} | " + " | ".join(str(c[n]) for n in names) + f" | {marks} | {drops} | {seconds:.0f} |")
    return "\n".join(lines)


def main():
    global BIN
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="every value once, not every pair")
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bound", type=int, default=240, help="seconds a run may take")
    p.add_argument("--floor", type=float, default=0.6, help="held-out accuracy every run must reach")
    p.add_argument("--out", default="out/matrix")
    p.add_argument("--doc", default=None, help="rewrite this file's matrix section (docs/reliability.md)")
    p.add_argument("--bin", default="target/release")
    p.add_argument("--only", default=None, help="comma-separated combination numbers")
    args = p.parse_args()
    BIN = (REPO / args.bin).resolve()
    combos = covering(args.seed, pairwise=not args.quick)
    only = {int(x) for x in args.only.split(",")} if args.only else None
    print(f"{len(combos)} combinations ({'every value' if args.quick else 'every pair'}), seed {args.seed}", flush=True)
    rows, failed = [], 0
    started = time.time()
    for i, c in enumerate(combos):
        if only is not None and i not in only:
            continue
        inv, dropped, events, seconds = run_one(i, c, args)
        bad = [k for k, (ok, _) in inv.items() if not ok]
        failed += bool(bad)
        desc = " ".join(f"{k}={v}" for k, v in c.items())
        print(f"[{i:2d}] {desc}: {'FAIL ' + ','.join(bad) if bad else 'ok'} ({seconds:.0f}s) {'; '.join(events)}", flush=True)
        for k, (ok, detail) in inv.items():
            print(f"       {'ok ' if ok else 'BAD'} {k}: {detail}", flush=True)
        rows.append((i, c, inv, dropped, seconds))
    total = time.time() - started
    text = table(rows)
    print(text)
    print(f"matrix: {len(rows)} runs, {failed} failing, {total:.0f}s", flush=True)
    if args.doc:
        doc = REPO / args.doc
        body = doc.read_text()
        section = (f"<!-- matrix:begin -->\n`{' '.join(sys.argv)}` — {len(rows)} runs, {failed} failing, "
                   f"{total:.0f} s on this machine ({time.strftime('%Y-%m-%d')}).\n\n{text}\n<!-- matrix:end -->")
        body = re.sub(r"<!-- matrix:begin -->.*<!-- matrix:end -->", lambda _: section, body, flags=re.S)
        doc.write_text(body)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
