"""Command-line plumbing shared by the scripts: bad input is one line on stderr and exit code 2, never
a traceback, and so is Ctrl-C (exit 130) and SIGTERM (exit 143); a flag is spelled out in full (no prefix
matching: a typo such as --iter is an error, not --iters); independent runs in parallel processes, the time a pool
of them takes (the estimate a script prints before it trains) and progress lines for work done in one process; an
earlier call's results to reuse; and the flags every script spells the same way, defined once here so that a name
means one thing everywhere:

  --preset {quick,paper}  hyper-parameters: CPU-sized, or the paper's (default: paper on CUDA, quick otherwise)
  --device DEV            cpu, cuda or cuda:<i> (default: cuda if available, else cpu)
  --threads T             torch threads of this process (parallel workers always get one each)
  --jobs J                independent runs at a time, as one-thread processes (default 2)
  --seeds LIST            seed values: 0-15, 0-3,7 (parse_list's syntax), never a count
  --figures DIR           where a figure's PNG and its JSON go (default figures)
  --out DIR               one run directory (train.py); --root DIR a directory of runs (k1.py, k2.py)
"""
import argparse
import ast
import inspect
import json
import math
import os
import re
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import fields, replace

import torch


JOBS = 2  # the development machine's cores; every script's default
TORCH_THREADS = torch.get_num_threads()  # torch's default, one per core: the most set_threads gives by default
PRESET_HELP = "hyper-parameters: quick (CPU-sized) or paper (the paper's); default paper on CUDA, quick otherwise"


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an unknown flag or a bad value is one line: `<prog>: error: <message>`; an abbreviated
    flag is unknown (argparse would silently take --iter 5 or --i 5 as --iters 5); --help shows every flag's
    default. Sub-commands' parsers are of this class too (add_parser passes `runs` on).
    runs: --help's closing paragraph, what the default run costs and leaves behind, "Default run: <how long, on which
    machine, when> (<what it is>); writes <the files>." and on a line of its own "--replot: seconds, trains nothing.";
    each line wrapped to the width argparse wraps the flags' help to."""

    def __init__(self, *args, runs: str | None = None, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        if runs is not None:
            kwargs["epilog"] = help_paragraph(runs)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def help_paragraph(text: str) -> str:
    """text with each of its lines wrapped as argparse wraps help, to the terminal's width less 2 (the descriptions
    are printed as written: HelpFormatter), paths and flags never split."""
    import shutil
    import textwrap
    width = max(shutil.get_terminal_size().columns - 2, 40)
    return "\n".join(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
                     for line in text.splitlines())


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; '(default: X)' after a flag's help unless the help already says its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS  # not 0
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: {action.default})"


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a scheduler's stop), raised where the process is, as Ctrl-C's KeyboardInterrupt is: the same
    clean-up and the same one line on what is on disk, then exit 143 as a shell reports it."""


TERMINATED = []  # the SIGTERMs this process got: the training loop replaces the Terminated it caught by its own line


def _terminate(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not interrupt the clean-up
    TERMINATED.append(signum)
    raise Terminated()


def run(main):
    """Call main(); a ValueError (how the library reports bad input) becomes a one-line error, exit 2; Ctrl-C
    one line (the training loop's says where it stopped and how to continue), exit 130 as a shell reports it;
    SIGTERM the same line, exit 143; output piped into a reader that stopped early (| head) nothing, exit 141. The
    process's SIGTERM handler is put back after."""
    TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        main()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        print(str(e) or ("terminated" if TERMINATED else "interrupted"), file=sys.stderr)
        sys.exit(143 if TERMINATED else 130)
    except BrokenPipeError:  # the output piped into a reader that stopped (| head): quiet, as a shell's tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would fail too
        sys.exit(141)
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------- the shared flags


def add_preset(parser: argparse.ArgumentParser, choices, values: str = ""):
    """--preset; `values` lists what the preset sets, e.g. 'quick: N = 128, 2000 steps; paper: ...'."""
    parser.add_argument("--preset", choices=sorted(choices), default=None,
                        help=PRESET_HELP + (f" ({values})" if values else ""))


def preset(name: str | None) -> str:
    """--preset's value, or the default for this machine."""
    return name or ("paper" if torch.cuda.is_available() else "quick")


def announce(preset: str, what: str, where: str):
    """A script's first line: its preset (on CUDA the paper's, unless --preset), what it runs and where it
    writes, so that a long run is never a surprise."""
    print(f"preset {preset}: {what}; writing {where}", flush=True)


def add_device(parser: argparse.ArgumentParser):
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:<i> (default: cuda if available, else cpu)")


def device(name: str | None) -> str:
    """--device's value checked here, before anything runs (torch accepts 'meta' and others that cannot
    train or evaluate), or the default for this machine."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:<i>, got {name!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return name


def add_threads(parser: argparse.ArgumentParser, default: int | None = None, why: str = ""):
    parser.add_argument("--threads", type=at_least(1), default=default,
                        help="torch threads of this process; parallel workers get one each (default: "
                             + (f"{default}{why}" if default else "one per core that no other process keeps busy "
                                "at the start") + ")")


def set_threads(threads: int | None):
    """--threads, or by default torch's one thread per core less the cores other processes keep busy now (at least
    one): two threads beside one busy process ran the main job's steps ~1.5x slower than one thread, where one
    thread alone is ~1.4x slower than two (bench/bench_threads.py, bench/README.md)."""
    if threads is not None:
        torch.set_num_threads(threads)
        return
    torch.set_num_threads(max(1, TORCH_THREADS - busy_cores()))


def busy_cores(samples: int = 5, every: float = 0.01, source: str = "/proc/loadavg") -> int:
    """How many cores other processes keep busy now: the runnable threads of /proc/loadavg (its fourth field, a count
    at this instant, unlike the load averages that lag by a minute) less this one, the median of a few samples; 0
    where there is no /proc."""
    try:
        counts = []
        for i in range(samples):
            with open(source) as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
            if i < samples - 1:
                time.sleep(every)
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, sorted(counts)[samples // 2])


def at_least(minimum: int):
    """An argparse type: an integer >= minimum written in digits, else argparse's one-line error naming the flag."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*-?\d+\s*", text) or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return int(text)
    parse.__name__ = f"an integer >= {minimum}"  # argparse's name for the type in its messages
    return parse


def add_jobs(parser: argparse.ArgumentParser):
    parser.add_argument("--jobs", type=at_least(1), default=JOBS, help="independent runs at a time, as one-thread "
                        "processes")


def parse_list(flag: str, text: str, inf: bool = False, rule: str = "") -> list[int | float]:
    """'64,80,94', '0-15' or mixed '0-3,7' -> the integers in that order (ranges inclusive); with inf=True
    the item 'inf' is math.inf (K = inf). A malformed item, an empty range or a repeated value is an error, whose
    line names the item and the rule (rule: what the flag takes, e.g. 'K: an integer from 1 to 65536, or inf')."""
    rule = rule or "integers >= 0 written in digits" + (", or inf" if inf else "")
    values = []
    for item in text.split(","):
        if inf and item.strip() == "inf":
            values.append(math.inf)
            continue
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if m is None:
            try:
                number = float(item)
            except ValueError:
                number = None
            why = ("is negative" if number is not None and number < 0 else
                   "is not an integer written in digits" if number is not None else "cannot be read")
            raise ValueError(f"{flag}: {item.strip()!r} {why} ({rule}; a list: 64,80,94 or 0-15 or 0-3,7)")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise ValueError(f"{flag}: empty range {item!r} (write low-high)")
        values += range(lo, hi + 1)
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{flag}: {', '.join(map(str, repeated))} listed more than once in {text!r}")
    return values


def add_seeds(parser: argparse.ArgumentParser, default: str | None, what: str, flag: str = "--seeds", *aliases: str):
    """A list of seed values in parse_list's syntax (parsed by the script, with parse_list)."""
    parser.add_argument(flag, *aliases, default=default, help=f"{what}: seed values, e.g. 0-15 or 0-3,7"
                        + ("" if default is None or "default" in what else f" (default: {default})"))


def field_comments(cls) -> dict[str, str]:
    """The comment after each field of the dataclass `cls` in its source: a field's help is written once, there."""
    lines = inspect.getsource(cls).splitlines()
    out = {}
    for node in ast.parse("\n".join(lines)).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            tail = lines[node.end_lineno - 1][node.end_col_offset:]
            if "#" in tail:
                out[node.target.id] = tail.split("#", 1)[1].strip()
    return out


def add_fields(parser: argparse.ArgumentParser, cls, presets: dict[str, dict], skip: tuple[str, ...] = ()):
    """A flag for every field of the dataclass `cls` but `skip` (--mlp-width for mlp_width; a bool field a switch),
    default None so that what was given can be told from what was not; its help the field's comment, then its
    default, or each preset's value where the presets set it."""
    comments = field_comments(cls)
    for f in fields(cls):
        if f.name in skip:
            continue
        if all(f.name in values for values in presets.values()):
            default = ", ".join(f"{name} {values[f.name]}" for name, values in presets.items())
        else:
            default = f"default {f.default}"
        text = comments.get(f.name, "")
        text = text if "default" in text or f.type is bool else f"{text} ({default})"
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:
            parser.add_argument(flag, action="store_true", default=None, dest=f.name, help=text)
        else:
            parser.add_argument(flag, type=type(f.default), default=None, dest=f.name, help=text)


def add_figures(parser: argparse.ArgumentParser):
    parser.add_argument("--figures", default="figures", help="directory for the figure's PNG and JSON")


def writable_dir(path: str, flag: str) -> str:
    """Create the directory `path` (a flag's value), or a one-line error now rather than a traceback when the
    first file is written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_test_{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write there ({e.strerror})") from None
    return path


def read_json(path: str, keys: tuple[str, ...], writer: str, flag: str = "--replot") -> dict:
    """The JSON object at `path` holding every one of `keys` (what a --replot draws from), or one line
    on what is missing or broken; writer: the command that writes the file."""
    try:
        with open(path) as f:
            result = json.load(f)
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {path} ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: {path} is not valid JSON ({e})") from None
    missing = [k for k in keys if not isinstance(result, dict) or k not in result]
    if missing:
        raise ValueError(f"{flag}: {path} lacks {', '.join(missing)} (not written by {writer}; rerun it)")
    return result


def earlier_results(path: str, config: dict, key: str) -> list:
    """The list `key` of the JSON object an earlier call wrote at `path` with the same "config", for a call to reuse;
    none where the file is absent or unreadable or holds another configuration's."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, json.JSONDecodeError):
        return []
    return earlier.get(key, []) if isinstance(earlier, dict) and earlier.get("config") == config else []


def add_replot(parser: argparse.ArgumentParser, default: str, what: str):
    """--replot [JSON], every script's one way to redraw: only draw `what` again from a JSON the script wrote (bare:
    `default`, e.g. FIGURES/k1.json), its PNG beside that JSON; nothing is trained or computed anew."""
    parser.add_argument("--replot", nargs="?", const="", default=None, metavar="JSON",
                        help=f"only redraw {what} from JSON (bare --replot: {default}), the PNG beside it")


def replot_path(args: argparse.Namespace, name: str) -> str:
    """The JSON --replot names: its value, or `name` in --figures (figures where the script has no such flag)."""
    return args.replot or os.path.join(getattr(args, "figures", "figures"), name)


def replot(args: argparse.Namespace, name: str, keys: tuple[str, ...], writer: str, draw, after=None):
    """A script's --replot [JSON]: draw(result, png) from the JSON (replot_path: --replot's value or FIGURES/name),
    the PNG beside it, then the line saying so and after(result) (a script's printed table), all under drawing()."""
    path = replot_path(args, name)
    png = os.path.splitext(path)[0] + ".png"

    def draw_and_say(result: dict):
        draw(result, png)
        print(f"wrote {png} from {path}")
        if after is not None:
            after(result)

    redraw(path, keys, writer, draw_and_say)


def redraw(path: str, keys: tuple[str, ...], writer: str, draw) -> dict:
    """draw(result) for the JSON object at `path` (read_json: it must hold `keys`), under drawing(); returns it."""
    result = read_json(path, keys, writer)
    with drawing(path, writer):
        draw(result)
    return result


@contextmanager
def drawing(path: str, writer: str):
    """A redraw from the JSON at `path`: what it cannot use, a key or row missing deeper in, an empty list, a string
    where a number belongs, is one line naming the file and what was wrong, not a traceback; and a string is never
    drawn as a category (matplotlib would place it at an arbitrary position): numeric text is read as its number,
    other text is an error."""
    import numpy as np
    from matplotlib import units  # the scripts that redraw import matplotlib anyway; the others never pay for it
    categorical = {t: units.registry.pop(t) for t in (str, bytes, np.str_, np.bytes_) if t in units.registry}
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        what = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'}"
        raise ValueError(f"--replot: {path} does not hold what {writer} draws ({what}); rerun {writer}") from None
    finally:
        units.registry.update(categorical)


# ----------------------------------------------------------------------------- parallel runs


def _worker_init():
    """A worker: one torch thread, and SIGINT ignored. Ctrl-C in a terminal signals the whole process group, a
    scheduler or `timeout -s INT` the parent alone; either way the parent alone stops the pool (parallel_map)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: _stop ends a worker with SIGTERM
    torch.set_num_threads(1)


def _stop(pool: ProcessPoolExecutor):
    """End the pool's workers now: shutdown() alone waits for the running jobs and would start the queued ones."""
    workers = list((pool._processes or {}).values())  # no public way to them before Python 3.14's terminate_workers
    pool.shutdown(wait=False, cancel_futures=True)
    for p in workers:
        p.terminate()
    for p in workers:
        p.join()


def parallel_map(fn, jobs, processes: int, progress: str = "", cost=None, on_result=None) -> list:
    """[fn(job) for job in jobs], in order, in `processes` worker processes with one torch thread each:
    on a few CPU cores independent runs go faster that way than as one process with several threads,
    and every run computes the same numbers whatever `processes` is. fn must be a module-level function.
    progress: a label; then a line `label: i/n done, elapsed, ETA` at most every 30 s and at the end, the ETA
    from the work done so far, counted in `cost` (each job's relative cost, e.g. its steps; default equal).
    on_result(job, result), if given, is called as each result comes in (in the jobs' order), so that a caller can
    keep each finished job before the others end.
    Ctrl-C, or a SIGINT sent to this process alone (the workers ignore it), ends the workers at once and the
    KeyboardInterrupt goes on (cli.run: one line, exit 130); an error in a job ends them too."""
    jobs = list(jobs)
    cost = [1.0] * len(jobs) if cost is None else [float(c) for c in cost]
    if len(cost) != len(jobs):
        raise ValueError(f"parallel_map: {len(cost)} costs for {len(jobs)} jobs")
    results, done, total = [], 0.0, sum(cost)
    t0 = t_print = time.time()
    pool = ProcessPoolExecutor(processes, initializer=_worker_init)
    try:
        for i, result in enumerate(pool.map(fn, jobs), 1):
            results.append(result)
            if on_result is not None:
                on_result(jobs[i - 1], result)
            done += cost[i - 1]
            now = time.time()
            if progress and (now - t_print >= 30 or i == len(jobs)):
                t_print = now
                eta = (now - t0) / done * (total - done) if done > 0 else math.nan
                print(f"{progress}: {i}/{len(jobs)} done, {(now - t0) / 60:.1f} min, ETA {eta / 60:.1f} min", flush=True)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return results


class WorkProgress:
    """Progress of work done in this process in parts of known size, {label: units} (parallel_map's lines are a pool's):
    a line `<label> ..%, <label> ..%: elapsed, ETA` at most every `every` seconds (none in a run shorter than that),
    the ETA, as parallel_map's, from the time the units done so far took."""

    def __init__(self, total: dict[str, float], every: float = 30):
        self.total, self.every = total, every
        self.done = {part: 0.0 for part in total}
        self.t0 = self.t_print = time.time()

    def add(self, part: str, units: float):
        self.done[part] += units
        now = time.time()
        if now - self.t_print >= self.every:
            self.t_print = now
            done = sum(self.done.values())
            eta = (now - self.t0) / done * (sum(self.total.values()) - done)
            print(f"{', '.join(f'{p} {100 * self.done[p] / self.total[p]:.0f} %' for p in self.total)}: "
                  f"{(now - self.t0) / 60:.1f} min, ETA {eta / 60:.1f} min", flush=True)


def makespan(seconds: list[float], processes: int) -> float:
    """Wall time of parallel_map's jobs of these durations: taken in order by `processes` workers, each taking the next
    when free, as its pool does."""
    free = [0.0] * processes
    for s in seconds:
        free[free.index(min(free))] += s
    return max(free)


def step_seconds(train, steps: int = 10) -> float:
    """Seconds a step of train(n), a training of n steps, takes on one thread (a parallel_map worker has one), here and
    now: after a warm-up, two short runs, 3 and 3 + steps long, so that set-up, the first steps and the evaluation
    cancel."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(1)  # the process's first steps pay for its lazy set-up
        times = []
        for n in (3, 3 + steps):
            t0 = time.perf_counter()
            train(n)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return max(times[1] - times[0], 1e-6) / steps


def processes(n: int) -> str:
    return f"{n} process{'es' if n > 1 else ''}"


def estimate(stages: list[list[tuple]], jobs: int, step_time, size: str, note: str = "") -> str:
    """The line a script prints before it trains: how long its stages take one after the other, each a pool of jobs
    (run, trainings of that run; a run a dataclass with `iters`), `jobs` at a time (makespan). step_time(run): the
    seconds a step of `run` takes on one thread (a script's step_seconds), measured at the smallest and the largest
    value of the runs' field `size`, linear between: the one size that moves it much. note: the line's end."""
    runs = [run for stage in stages for run, _ in stage]
    lo, hi = min(getattr(r, size) for r in runs), max(getattr(r, size) for r in runs)
    s_lo = step_time(replace(runs[0], **{size: lo}))
    s_hi = step_time(replace(runs[0], **{size: hi})) if hi > lo else s_lo
    seconds = iter((s_lo + (s_hi - s_lo) * (getattr(r, size) - lo) / max(hi - lo, 1)) * r.iters for r in runs)
    wall = sum(makespan([n * next(seconds) for _, n in stage], jobs) for stage in stages)
    steps = ", ".join(map(str, sorted({run.iters for run in runs})))
    ms = "-".join(map(str, sorted({round(s_lo * 1e3), round(s_hi * 1e3)})))
    return (f"estimate: {sum(n for stage in stages for _, n in stage)} trainings of {steps} steps at {ms} ms a step "
            f"(measured here on one thread): ~{wall / 60:.1f} min with {processes(jobs)}{note}")
