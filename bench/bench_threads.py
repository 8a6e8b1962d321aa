"""Benchmark (not a test): the main job's training steps on a CPU, alone and beside busy processes, for the thread
settings a newcomer's `python train.py --K 256` could run with:

  2 threads             torch's own default on a 2-core machine, one thread per core (OpenMP's threads spin a while
                        as they wait for each other, then sleep: OMP_WAIT_POLICY unset) -- the baseline
  2 threads, passive    the same threads, sleeping at once while they wait (OMP_WAIT_POLICY=PASSIVE)
  1 thread              --threads 1, nothing to wait for
  the default           no --threads: one thread per core that no other process keeps busy at the start
                        (plumbing/cli.py's set_threads)

    python bench/bench_threads.py [--iters 60] [--busy 0,1,2] [--rounds 2]

Each setting runs `train.py --K 256 --iters ITERS --evals 1` in a fresh process (the wait policy is read once, when
OpenMP starts) and reports the seconds of its steps alone (train.py's last line: the set-up and the evaluations left
out, whole seconds), beside 0, 1, 2 ... busy processes of the same priority, each a one-thread torch matmul loop
(another one-thread training job) started a second before. Rounds interleave the settings, so that a busy spell
slows all alike; medians over rounds.
"""
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plumbing import cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"2 threads": (["--threads", "2"], None), "2 threads, passive": (["--threads", "2"], "PASSIVE"),
            "1 thread": (["--threads", "1"], None), "the default": ([], None)}  # flags, OMP_WAIT_POLICY
BUSY = ("import torch; torch.set_num_threads(1); a = torch.randn(256, 256)\n"
        "while True: a = torch.tanh(a @ a / 16)")


def steps_seconds(flags: list, policy: str | None, iters: int, out: str) -> float:
    """The seconds of the steps of one train.py run in a fresh process (its last line's 'steps X s')."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.update({"OMP_WAIT_POLICY": policy} if policy else {})
    done = subprocess.run([sys.executable, "train.py", "--K", "256", "--iters", str(iters), "--evals", "1", *flags,
                           "--out", out, "--overwrite"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()
    threads = re.search(r"\((\d+) threads?\)", done[0])[1]
    return float(re.search(r"steps (\d+(?:\.\d+)?) s", done[-1])[1]), int(threads)


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--iters", type=cli.at_least(1), default=60, help="training steps per run")
    parser.add_argument("--busy", default="0,1,2", help="how many busy processes beside the run, a list")
    parser.add_argument("--rounds", type=cli.at_least(1), default=2, help="interleaved rounds (medians over them)")
    args = parser.parse_args()
    iters, rounds = args.iters, args.rounds
    loads = cli.parse_list("--busy", args.busy)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load before "
          f"{os.getloadavg()[0]:.2f}; train.py --K 256, {iters} steps, seconds of the steps (medians of {rounds})",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for busy in loads:
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(int(busy))]
            time.sleep(1)  # the busy processes past their imports: running, as the default's count sees them
            try:
                times, threads = {name: [] for name in SETTINGS}, {name: set() for name in SETTINGS}
                for _ in range(rounds):
                    for name, (flags, policy) in SETTINGS.items():
                        seconds, used = steps_seconds(flags, policy, iters, os.path.join(tmp, "run"))
                        times[name].append(seconds)
                        threads[name].add(used)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            base = float(np.median(times["2 threads"]))
            for name, t in times.items():
                median = float(np.median(t))
                print(f"busy {int(busy)} | {name:<18} {median:6.1f} s ({iters / median:4.1f} steps/s) | x{base / median:.2f} "
                      f"vs 2 threads | threads used {sorted(threads[name])} | rounds {t}", flush=True)


if __name__ == "__main__":
    cli.run(main)
