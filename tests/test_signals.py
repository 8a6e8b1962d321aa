"""Stopping a script that runs jobs through cli.parallel_map: Ctrl-C in a terminal signals the whole process group,
while `timeout -s INT`, schedulers and process managers signal the parent alone. Either way the script ends its
workers, says one line and exits 130 (cli.run), within seconds rather than after the running and queued jobs; SIGTERM
(kill, a scheduler's stop) the same, exit 143."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import os
import sys
import time

sys.path.insert(0, {root!r})
from plumbing import cli


def slow(i):  # like train.py's loop, it says so when interrupted: in a worker that would be a second line
    open(os.path.join({marks!r}, str(os.getpid())), "w").close()
    try:
        time.sleep(300)
    except KeyboardInterrupt:
        print(f"job {{i}} interrupted", file=sys.stderr)
        raise
    return i


if __name__ == "__main__":
    cli.run(lambda: cli.parallel_map(slow, range(6), 2, progress="slow jobs"))
"""

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads worker processes' states in /proc")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("whole_group, sig", [(False, signal.SIGINT), (True, signal.SIGINT), (False, signal.SIGTERM)],
                         ids=["parent alone", "process group", "SIGTERM to the parent"])
def test_sigint_ends_a_pool_at_once_with_one_line_and_exit_130(tmp_path, whole_group, sig):
    """SIGTERM (kill, a scheduler's stop) alike, with its own line and exit 143."""
    marks = tmp_path / "workers"
    marks.mkdir()
    script = tmp_path / "slow_pool.py"
    script.write_text(SCRIPT.format(root=ROOT, marks=str(marks)))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,  # its own group: a group signal reaches nothing else
                            # SIGINT as a terminal gives it: a suite started in the background of a shell without job
                            # control inherits SIGINT ignored, and Python then installs no KeyboardInterrupt at all
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    workers = []
    try:
        deadline = time.time() + 120
        while len(workers) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
            workers = [int(p) for p in os.listdir(marks)]
        assert len(workers) == 2, f"the two workers did not start: {proc.poll()}"
        time.sleep(0.5)
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        t0 = time.time()
        out, err = proc.communicate(timeout=30)
        assert time.time() - t0 < 10
        assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
        assert err.splitlines() == ["terminated" if sig == signal.SIGTERM else "interrupted"] and out == ""
        deadline = time.time() + 5
        while any(alive(p) for p in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers)
        assert len(os.listdir(marks)) == 2  # no queued job started
    finally:
        for pid in [proc.pid, *workers]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
