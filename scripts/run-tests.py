#!/usr/bin/env python3
"""Runs the workspace's test binaries, lab tests several at a time, and sums them up.

    scripts/run-tests.py [--jobs N] [--timeout SECS] [--background NAME CMD]... < artifacts.json

Reads the JSON lines of `cargo test --workspace --no-run --message-format=json` on stdin (the
binaries `scripts/test.sh` built a moment before) and runs every test executable in it, as
`cargo test` would (same working directory, same CARGO_* variables), but not one after another:

* unit and engine tests first, one at a time (they take seconds and need the whole machine
  for nothing);
* then the lab tests (package tcpshadow-tests) N at a time, those of ALONE first and by
  themselves, then longest first, never two of APART
  at once. Each lab test builds its own lab under a unique name and waits on events, not on a
  quiet machine, so they
  can share the two cores; on this kind of machine they spend three quarters of their time
  waiting for servers, sysbench and fault windows, which is the time this recovers.
* `--background NAME CMD` (repeatable, run in order) runs beside the lab tests at the lowest CPU
  priority (SCHED_IDLE, in a session of its own with the autogroup's nice at 19): CPU-bound
  work like the doc tests and the short fuzz run that only fills the cores the labs leave idle.

Every run's output goes to target/test-logs/<name>.log; a failed one is printed in full at the
end. A binary still running after --timeout seconds is killed (its whole process group) and
counted as failed, so a hung test fails the suite instead of hanging CI. The last line is the
summary: tests passed, failed and ignored, the failed runs by name, and the wall time.

Exit status 0 only if every run passed.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

# Longest first (seconds measured on a 2-core machine, scripts/test.sh, December 2026): the
# suite ends when its slowest binary does, so that one must start at once. Names not listed
# run after these, in name order.
EXPECTED_SECS = {
    "faults": 200, "pools": 160, "probe": 140, "mysql": 125, "pickup": 80, "doctor": 74,
    "report": 68, "ab": 110, "replay": 58, "mirror": 53, "budget": 53, "scale": 43, "losses": 43,
    "onhost": 28, "lab": 25, "read_only": 25, "metrics": 23, "shaping": 20, "mysql_clients": 20,
    "guard": 19, "tls_probe": 15, "resources": 15, "lab_test2": 13, "deploy": 7, "report_html": 6,
}
# Never run at the same time: `faults` judges a starved copier over its whole run (fault g
# stops it past what its capture ring holds, and how fast it catches up after is part of the
# figure), and `pools` keeps three language runtimes and both servers busy. Beside each other
# the copier of fault g lost 0.20 of the run's work (bar: 0.15), 0.09 in its earlier runs.
# `ab` compares two test servers' latencies to a band learnt minutes before: a neighbour's
# burst in one of its runs only would be measured as a difference.
APART = {"faults", "pools", "ab"}
# Run with nothing beside them, first: `probe` drives the test server to its knee on purpose
# (all of both cores); beside it `faults` lost 0.16 of a run's work in fault g (bar: 0.15) and
# 0.011 in fault c (fresh-clone run of c0cd92c). `faults` itself: fault g's copier, stopped past
# what its ring holds, catches up on whatever CPU the machine has left, so its loss is the
# neighbour's as much as its own: 0.152 beside `mysql` (fresh clone of 715df8d), 0.12-0.13
# alone, the same with 300cc6d's binaries (0.122, 0.123), against a bar of 0.15.
ALONE = {"probe", "faults"}
RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")


class Run:
    def __init__(self, name, argv, cwd, env, log, background=False):
        self.name, self.argv, self.cwd, self.env, self.log = name, argv, cwd, env, log
        self.background = background
        self.passed = self.failed = self.ignored = 0
        self.status = None
        self.timed_out = False
        self.secs = 0.0

    def ok(self):
        return self.status == 0 and not self.timed_out and self.failed == 0


def lowest_priority():
    # Runs in the child before exec: its own session (so its own autogroup), that autogroup at
    # nice 19, and SCHED_IDLE: it gets a core only when nothing else wants it.
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        os.nice(19)


def execute(run, timeout):
    t0 = time.monotonic()
    with open(run.log, "w") as out:
        out.write("$ " + " ".join(run.argv) + "\n")
        out.flush()
        child = subprocess.Popen(
            run.argv, cwd=run.cwd, env=run.env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lowest_priority if run.background else None,
            start_new_session=not run.background,
        )
        try:
            run.status = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            run.status = child.wait()
            out.write(f"\nrun-tests: killed after {timeout} s (--timeout)\n")
    run.secs = time.monotonic() - t0
    with open(run.log, errors="replace") as f:
        for line in f:
            m = RESULT.match(line.strip())
            if m:
                run.passed += int(m.group(1))
                run.failed += int(m.group(2))
                run.ignored += int(m.group(3))
    verdict = "ok" if run.ok() else ("TIMED OUT" if run.timed_out else "FAILED")
    counts = f"{run.passed} passed" + (f", {run.failed} failed" if run.failed else "")
    print(f"    {verdict:<9} {run.name:<28} {run.secs:5.0f} s  ({counts})", flush=True)


def artifacts(stream, logs):
    """(unit runs, lab runs) from cargo's JSON lines."""
    units, labs = [], []
    cargo = os.environ.get("CARGO") or "cargo"
    for line in stream:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        manifest = msg["manifest_path"]
        pkg_dir = os.path.dirname(manifest)
        pkg = os.path.basename(pkg_dir)
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{pkg}:{kind}:{target['name']}"
        env = dict(os.environ, CARGO=cargo, CARGO_MANIFEST_DIR=pkg_dir)
        is_lab = kind == "test" and pkg == "tests"
        run = Run(name, [msg["executable"]], pkg_dir, env,
                  os.path.join(logs, name.replace(":", "-") + ".log"))
        (labs if is_lab else units).append(run)
    labs.sort(key=lambda r: (-EXPECTED_SECS.get(r.name, 0), r.name))
    return units, labs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="lab test binaries at a time (2)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per binary (1200)")
    ap.add_argument("--background", action="append", default=[], nargs=2,
                    metavar=("NAME", "CMD"),
                    help="shell command run beside the lab tests at the lowest priority")
    ap.add_argument("--logs", default="target/test-logs", help="where the logs go")
    ap.add_argument("--since", type=float, metavar="EPOCH",
                    help="count the summary's time from here (scripts/test.sh's start)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs takes a number >= 1")
    os.makedirs(args.logs, exist_ok=True)
    t0 = time.monotonic()
    units, labs = artifacts(sys.stdin, args.logs)
    if not units and not labs:
        print("run-tests: no test executables in the input (pipe cargo test --no-run "
              "--message-format=json into it)", file=sys.stderr)
        return 2

    print(f"==> {len(units)} unit test binaries, one at a time", flush=True)
    for run in units:
        execute(run, args.timeout)

    background = [Run(name, ["bash", "-c", cmd], os.getcwd(), dict(os.environ),
                      os.path.join(args.logs, name.replace(" ", "-") + ".log"), background=True)
                  for name, cmd in args.background]

    def chain():
        for run in background:
            execute(run, args.timeout)

    behind = threading.Thread(target=chain)
    behind.start()
    print(f"==> {len(labs)} lab test binaries, {args.jobs} at a time"
          + (f"; beside them at idle priority: {', '.join(n for n, _ in args.background)}"
             if background else ""), flush=True)
    # ALONE runs first, while nothing else has started.
    queue = [r for r in labs if r.name in ALONE] + [r for r in labs if r.name not in ALONE]
    running = set()
    changed = threading.Condition()

    def next_run():
        # The first queued run that may start now (see APART, ALONE); None: wait for one to end.
        if running & ALONE:
            return None
        apart = bool(running & APART)
        return next((r for r in queue
                     if not (apart and r.name in APART) and not (running and r.name in ALONE)),
                    None)

    def worker():
        while True:
            with changed:
                while queue and next_run() is None:
                    changed.wait()
                if not queue:
                    return
                run = next_run()
                queue.remove(run)
                running.add(run.name)
            execute(run, args.timeout)
            with changed:
                running.discard(run.name)
                changed.notify_all()

    workers = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    behind.join()

    runs = units + labs + background
    bad = [r for r in runs if not r.ok()]
    for r in bad:
        print(f"\n======== {r.name} ({r.log}) ========", flush=True)
        with open(r.log, errors="replace") as f:
            sys.stdout.write(f.read())
    passed = sum(r.passed for r in runs)
    failed = sum(r.failed for r in runs)
    ignored = sum(r.ignored for r in runs)
    secs = int(time.time() - args.since if args.since else time.monotonic() - t0)
    line = (f"tests: {passed} passed, {failed} failed, {ignored} ignored "
            f"in {len(runs)} runs, {secs // 60} min {secs % 60} s")
    if bad:
        line += "; FAILED: " + ", ".join(r.name for r in bad)
    print("\n" + line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
