"""Web tier: what loading the portal costs a web process and a Celery worker, and requests/s.

Two checkouts in the same run, with the same virtualenv (this interpreter): the current one
(`after`, the repository this file is in, as it stands) and a baseline (`before`, a git ref,
`f89ff7e` by default, checked out with `git worktree add --detach` into a temporary directory and
removed at the end). Each runs with its own code first on PYTHONPATH, from its own directory, on
its own fresh SQLite database and var directory: `manage.py migrate`, `manage.py collectstatic`
(DEBUG is off, as in production, so pages need the collected manifest), then one public active run
and `--volunteers` volunteers with credit rows, seeded by `bench/webtier_checkout.py` through the
models alone. Nothing here imports the portal's code: it is reached over HTTP and in subprocesses.

1. Loading, in a fresh process per measurement (`--import-repeats` each, checkouts alternating,
   the median time and the last one's other figures): a web process (`django.setup()`, import
   `portal.asgi`, then `get_resolver().url_patterns`, which imports `portal.urls` and every view as
   the first request would) and a Celery worker (`django.setup()`, import `portal.celery`, then
   its task autodiscovery, `app.loader.import_default_modules()`). Seconds from the child's first
   line, `len(sys.modules)`, resident memory (psutil), and whether torch, hivemind and
   transformers were loaded.
2. A real server, `python -m uvicorn portal.asgi:application --workers W` (W = 1 and 2), serves
   `--requests` mixed GETs: the pages `/`, `/runs/<slug>/`, `/leaderboard/` and the API's
   `/api/v1/runs/`, `/api/v1/runs/<slug>/`, `/api/v1/runs/<slug>/leaderboard`,
   `/api/v1/leaderboard` (portal/urls.py, runs/urls.py, runs/api/routes.py), round robin over
   `--mixed-connections` connections; every answer must be 200. Then the resident memory of the
   server's process tree, in all and per process (W > 1: uvicorn's supervisor, the resource tracker
   of its `multiprocessing` and the workers).
3. On the same server, requests/s of the run list (`/api/v1/runs/`) and a run's board
   (`/api/v1/runs/<slug>/leaderboard`): `--connections` keep-alive connections, opened one by one
   during the first half of `--warmup`, in a closed loop (each sends its next request once the
   previous is answered) for `--seconds` after `--warmup`; p50/p99 of the latencies of the requests
   answered in the window. The client is an aiohttp loop in a process of its own (not the server's
   GIL), on the same cores as the server. The CPU seconds each server process used meanwhile are
   printed too, to show how the connections spread over the workers (UNEVEN: one did over 80%), and the
   requests answered (warm-up included) per CPU second the server used: what a worker with a core of its
   own serves, which a busy machine's req/s hides.

With `--redis`, both checkouts serve with a redis-server of the bench's own (a database each), as production
does: Django's cache, the channel layer and, where the checkout has them, the API's snapshots
(portal/snapshots.py), whose version the seed publishes.

2 and 3 are done `--rounds` times, each round starting every server afresh, W = 1 then 2, the
baseline's before the current one's each time; the table has the medians. Printed: a table of both
checkouts' figures with after/before; `--json PATH` writes them and every round's. Every server,
child process and the baseline's worktree are removed at the end, on failure and on Ctrl-C too.

    .venv/bin/python -m bench.webtier                      # baseline f89ff7e, 1,000 mixed requests, 3 rounds
    .venv/bin/python -m bench.webtier --baseline main~3 --requests 200 --rounds 1 --json /tmp/webtier.json
    .venv/bin/python -m bench.webtier --baseline 867e977 --redis --volunteers 100000 --workers 1 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD_SOURCE = (Path(__file__).resolve().parent / "webtier_checkout.py").read_text()
HEAVY = ("torch", "hivemind", "transformers")
RUN_SLUG = "webtier-bench"
BENCH_SECRET = "bench-webtier-not-a-secret-0123456789abcdefghijklmnopqrstuvwxyz"


# --- the checkouts ----------------------------------------------------------------------------

@dataclass
class Checkout:
    """One tree of the portal's code with its own database and var directory."""

    label: str  # before / after
    path: Path
    commit: str
    scratch: Path  # database, var directory, static files, logs
    env: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.path),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "DATABASE_URL": f"sqlite:///{self.scratch / 'db.sqlite3'}",
            "PORTAL_VAR_DIR": str(self.scratch / "var"),
            "STATIC_ROOT": str(self.scratch / "static"),
            "REDIS_URL": "",
            "DEBUG": "false",
            "SECRET_KEY": BENCH_SECRET,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "LOG_LEVEL": "WARNING",
        }

    def run(self, *args: str, timeout: float = 600) -> str:
        """A command of this checkout's Python, from its directory; its stdout."""
        done = subprocess.run([sys.executable, *args], cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"{self.label}: {' '.join(args[:3])} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done.stdout

    def child(self, *args: str) -> dict:
        """bench/webtier_checkout.py run with this checkout's code; its JSON answer."""
        return json.loads(self.run("-c", CHILD_SOURCE, *args).strip().splitlines()[-1])


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def checkout_current(scratch: Path) -> Checkout:
    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " + uncommitted changes"
    return Checkout("after", ROOT, commit, scratch / "after")


def checkout_baseline_add(ref: str, scratch: Path) -> Checkout:
    path = scratch / "baseline"
    git("worktree", "add", "--detach", str(path), ref)
    return Checkout("before", path, git("rev-parse", "--short", "HEAD", cwd=path), scratch / "before")


def checkout_baseline_remove(path: Path) -> None:
    """Remove the baseline's worktree (only this one: other worktrees of the repository are left alone)."""
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)


def checkout_prepare(checkout: Checkout, volunteers: int) -> None:
    """A fresh database with the run and its volunteers, and the static files' manifest."""
    checkout.run("manage.py", "migrate", "--verbosity", "0")
    checkout.run("manage.py", "collectstatic", "--noinput", "--verbosity", "0")
    checkout.child("seed", RUN_SLUG, str(volunteers))


def import_cost(checkout: Checkout, kind: str) -> dict:
    figures = checkout.child("import", kind)
    if Path(figures["portal"]) != checkout.path / "portal":
        raise RuntimeError(f"{checkout.label}: imported the portal from {figures['portal']}, not {checkout.path}")
    return figures


# --- the server -------------------------------------------------------------------------------

def port_free() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    """`uvicorn portal.asgi:application` of one checkout, in a session (process group) of its own."""

    checkout: Checkout
    workers: int
    port: int = 0
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> None:
        self.port = port_free()
        self.log = self.checkout.scratch / f"uvicorn-{self.workers}w-{self.port}.log"
        # --log-level info for "Started server process", which uvicorn logs once a process has
        # loaded the application; --no-access-log keeps the requests out of the log.
        command = [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", str(self.workers), "--log-level", "info",
                   "--no-access-log", "--lifespan", "off"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=self.checkout.path, env=self.checkout.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while self.log.read_text(errors="replace").count("Started server process") < self.workers:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn ({self.checkout.label}) exited:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn ({self.checkout.label}) did not start within {timeout:.0f} s")
            time.sleep(0.2)

    def memory(self) -> list[dict]:
        """Resident memory of each process of the server's tree, the supervisor first."""
        import psutil

        root = psutil.Process(self.process.pid)
        processes = []
        for process in [root, *root.children(recursive=True)]:
            try:
                command = " ".join(process.cmdline())
                if process.pid == root.pid:
                    role = "server" if self.workers == 1 else "supervisor"
                elif "resource_tracker" in command:
                    role = "resource tracker"
                else:
                    role = "worker" if "spawn_main" in command else process.name()
                processes.append({"pid": process.pid, "role": role, "rss_mb": process.memory_info().rss / 2**20})
            except psutil.NoSuchProcess:
                pass
        return processes

    def cpu(self) -> dict[int, float]:
        """CPU seconds (user + system) each process of the server's tree has used so far."""
        import psutil

        root = psutil.Process(self.process.pid)
        seconds = {}
        for process in [root, *root.children(recursive=True)]:
            try:
                times = process.cpu_times()
                seconds[process.pid] = times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return seconds

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                pass


@dataclass
class Redis:
    """A redis-server of the bench's own on a free loopback port (Debian's, as `.ci/run` installs)."""

    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def redis_start(scratch: Path) -> Redis:
    if not shutil.which("redis-server"):
        raise SystemExit("--redis needs redis-server on PATH (Debian: apt-get install redis-server)")
    port = port_free()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(scratch)], stdout=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Redis(process, port)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


# --- the load client (runs in a process of its own) --------------------------------------------

async def load_drive(base: str, paths: list[str], connections: int, *, count: int = 0, seconds: float = 0.0,
                     warmup: float = 0.0) -> dict:
    """GETs of ``paths`` in turn over ``connections`` keep-alive connections, each in a closed loop:
    ``count`` requests in all, or as many as fit in ``warmup`` + ``seconds`` (only those answered
    in the last ``seconds`` count). Answers' statuses, and latencies of the counted ones."""
    import aiohttp

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    sent = 0
    started = time.perf_counter()
    window_from, window_to = started + warmup, started + warmup + seconds

    async def connection(session: aiohttp.ClientSession, index: int) -> None:
        nonlocal sent
        # The connections open one by one over the first half of the warm-up: opened in one burst,
        # they are all accepted by whichever uvicorn worker wakes first (asyncio accepts a burst of
        # connections in one go), and the other worker idles.
        await asyncio.sleep(index * warmup / 2 / connections)
        while True:
            if count and sent >= count or not count and time.perf_counter() >= window_to:
                return
            path = paths[sent % len(paths)]
            sent += 1
            asked = time.perf_counter()
            try:
                async with session.get(base + path, allow_redirects=False) as response:
                    await response.read()
                    status = str(response.status)
            except (TimeoutError, aiohttp.ClientError) as exc:
                status = type(exc).__name__
            answered = time.perf_counter()
            key = "200" if status == "200" else f"{status} {path}"
            statuses[key] = statuses.get(key, 0) + 1
            if count or window_from <= answered <= window_to:
                latencies.append(answered - asked)

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(connection(session, index) for index in range(connections)))
    elapsed = seconds if not count else time.perf_counter() - started
    ordered = sorted(latencies) or [float("nan")]
    return {"requests": len(latencies), "answered": sum(statuses.values()), "seconds": elapsed,
            "per_second": len(latencies) / elapsed if elapsed else 0.0,
            "p50_ms": ordered[len(ordered) // 2] * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, "statuses": statuses}


LOAD_CLIENT = ("import asyncio, json, sys; from bench.webtier import load_drive; "
               "print(json.dumps(asyncio.run(load_drive(**json.loads(sys.argv[1])))))")


def load(base: str, paths: list[str], connections: int, **window) -> dict:
    """:func:`load_drive` in a Python process of its own (neither this one's GIL nor the server's);
    killed if this one is interrupted."""
    request = json.dumps({"base": base, "paths": paths, "connections": connections, **window})
    done = subprocess.run([sys.executable, "-c", LOAD_CLIENT, request], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        raise RuntimeError(f"the load client exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


# --- the table ----------------------------------------------------------------------------------

@dataclass
class Figure:
    name: str
    unit: str
    before: float | str
    after: float | str
    higher_is_better: bool | None = None

    @property
    def ratio(self) -> float | None:
        if isinstance(self.before, (int, float)) and isinstance(self.after, (int, float)) and self.before:
            return self.after / self.before
        return None

    def line(self) -> str:
        decimals = {"s": 2, "ms": 1, "MB": 1}.get(self.unit, 0)

        def shown(value) -> str:
            return f"{value:,.{decimals}f}" if isinstance(value, (int, float)) else str(value)

        ratio = f"{self.ratio:.2f}" if self.ratio is not None else ""
        return f"{self.name:<44} {self.unit:<8} {shown(self.before):>18} {shown(self.after):>18} {ratio:>12}"


def heavy_shown(modules: list[str]) -> str:
    return ", ".join(modules) if modules else "none"


def server_summary(results: list[dict]) -> dict:
    """The medians of one checkout's rounds with one worker count (the rounds themselves kept)."""
    return {
        "memory_mb": statistics.median(result["memory_mb"] for result in results),
        "worker_mean_mb": statistics.median(result["worker_mean_mb"] for result in results),
        "load": {name: {figure: statistics.median(result["load"][name][figure] for result in results)
                        for figure in ("per_second", "per_cpu_second", "p50_ms", "p99_ms")}
                 for name in results[0]["load"]},
        "rounds": results,
    }


def figures_table(imports: dict, servers: dict, workers: list[int]) -> list[Figure]:
    figures = []
    for kind, title in (("web", "web process"), ("worker", "Celery worker")):
        before, after = imports["before"][kind], imports["after"][kind]
        figures += [
            Figure(f"{title}: load", "s", before["seconds"], after["seconds"], False),
            Figure(f"{title}: modules", "count", before["modules"], after["modules"], False),
            Figure(f"{title}: resident memory", "MB", before["rss_mb"], after["rss_mb"], False),
            Figure(f"{title}: heavy modules loaded", "", heavy_shown(before["heavy"]), heavy_shown(after["heavy"])),
        ]
    for count in workers:
        before, after = servers["before"][count], servers["after"][count]
        figures.append(Figure(f"uvicorn {count}w: memory after mixed requests", "MB",
                              before["memory_mb"], after["memory_mb"], False))
        if count > 1:
            figures.append(Figure(f"uvicorn {count}w: per worker (mean)", "MB", before["worker_mean_mb"],
                                  after["worker_mean_mb"], False))
        for name in ("run list", "run board"):
            one, other = before["load"][name], after["load"][name]
            figures += [
                Figure(f"uvicorn {count}w: {name}", "req/s", one["per_second"], other["per_second"], True),
                Figure(f"uvicorn {count}w: {name} per server CPU s", "req", one["per_cpu_second"],
                       other["per_cpu_second"], True),
                Figure(f"uvicorn {count}w: {name} p50", "ms", one["p50_ms"], other["p50_ms"], False),
                Figure(f"uvicorn {count}w: {name} p99", "ms", one["p99_ms"], other["p99_ms"], False),
            ]
    return figures


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# --- the benchmark ------------------------------------------------------------------------------

def server_measure(checkout: Checkout, workers: int, args) -> dict:
    """Start the checkout's server with ``workers`` workers, serve the mixed requests, read its
    memory, measure the run list and the run board; stop it."""
    slug = RUN_SLUG
    mixed = ["/", f"/runs/{slug}/", "/leaderboard/", "/api/v1/runs/", f"/api/v1/runs/{slug}/",
             f"/api/v1/runs/{slug}/leaderboard", "/api/v1/leaderboard"]
    endpoints = {"run list": "/api/v1/runs/", "run board": f"/api/v1/runs/{slug}/leaderboard"}
    server = Server(checkout, workers)
    try:
        started = time.perf_counter()
        server.start()
        ready = time.perf_counter() - started
        served = load(server.base, mixed, args.mixed_connections, count=args.requests)
        failed = {status: number for status, number in served["statuses"].items() if status != "200"}
        if failed:
            raise RuntimeError(f"{checkout.label}, {workers} worker(s): mixed requests answered {failed}; "
                               f"server log {server.log}")
        processes = server.memory()
        worker_rss = [process["rss_mb"] for process in processes if process["role"] in ("worker", "server")]
        result = {"ready_s": ready, "mixed": served, "processes": processes,
                  "memory_mb": sum(process["rss_mb"] for process in processes),
                  "worker_mean_mb": statistics.mean(worker_rss) if worker_rss else float("nan"), "load": {}}
        print(f"  {checkout.label:<6} uvicorn {workers}w ready in {ready:.1f} s; {served['requests']} mixed requests "
              f"({served['per_second']:.0f}/s), all 200; memory "
              + ", ".join(f"{process['role']} {process['pid']} {process['rss_mb']:.1f} MB" for process in processes)
              + f" = {result['memory_mb']:.1f} MB", flush=True)
        for name, path in endpoints.items():
            cpu_from = server.cpu()
            measured = load(server.base, [path], args.connections, seconds=args.seconds, warmup=args.warmup)
            # How the work spread over the processes: CPU seconds each used, warm-up included.
            measured["cpu_s"] = {pid: seconds - cpu_from.get(pid, 0.0) for pid, seconds in server.cpu().items()}
            busiest = max(measured["cpu_s"].values()) / (sum(measured["cpu_s"].values()) or 1)
            # What one core of the server answers when it has the core to itself: on a busy machine the
            # server gets a share of the cores and req/s says more about the neighbours than about it.
            measured["per_cpu_second"] = measured["answered"] / (sum(measured["cpu_s"].values()) or float("nan"))
            measured["uneven"] = workers > 1 and busiest > 0.8
            failed = {status: number for status, number in measured["statuses"].items() if status != "200"}
            if failed:
                raise RuntimeError(f"{checkout.label}, {workers} worker(s), {path}: answered {failed}")
            result["load"][name] = measured
            uneven = "   UNEVEN: one worker did most of the work" if measured["uneven"] else ""
            print(f"  {checkout.label:<6} uvicorn {workers}w {name:<9} {measured['per_second']:7.0f} req/s   "
                  f"p50 {measured['p50_ms']:6.1f} ms   p99 {measured['p99_ms']:6.1f} ms   "
                  f"{measured['per_cpu_second']:6.0f} req per server CPU s   "
                  f"({measured['requests']} in {args.seconds:g} s, {args.connections} connections; CPU s "
                  f"{', '.join(f'{seconds:.1f}' for seconds in measured['cpu_s'].values())})   "
                  f"load {os.getloadavg()[0]:.2f}{uneven}", flush=True)
        return result
    finally:
        server.stop()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.webtier", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="f89ff7e", help="git ref of the baseline (before) checkout")
    parser.add_argument("--requests", type=int, default=1000, help="mixed requests each server serves before its memory is read")
    parser.add_argument("--mixed-connections", type=int, default=4, help="connections the mixed requests are sent over")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="uvicorn worker counts, one server each")
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections of the requests/s client")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per endpoint")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times every server is started and measured, checkouts alternating (medians are printed)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of requests before the window opens")
    parser.add_argument("--import-repeats", type=int, default=3, help="fresh processes per import measurement")
    parser.add_argument("--volunteers", type=int, default=50, help="volunteers with credit in the seeded run")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (databases, server logs)")
    parser.add_argument("--redis", action="store_true",
                        help="serve with Redis (a redis-server of the bench's own; each checkout a database of it), "
                             "as production does: the cache, the channel layer and the API's snapshots")
    return parser.parse_args()


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally blocks, as Ctrl-C does


def main() -> None:
    args = _parse()
    signal.signal(signal.SIGTERM, _terminated)
    scratch = Path(tempfile.mkdtemp(prefix="bench-webtier-"))
    baseline_path = scratch / "baseline"
    redis = None
    try:
        print(f"{os.cpu_count()} CPUs; {uptime()}; scratch {scratch}", flush=True)
        current = checkout_current(scratch)
        baseline = checkout_baseline_add(args.baseline, scratch)
        checkouts = [baseline, current]
        if args.redis:
            redis = redis_start(scratch)
            for number, checkout in enumerate(checkouts):
                checkout.env["REDIS_URL"] = f"{redis.url}/{number}"
        for checkout in checkouts:
            print(f"{checkout.label:<6} {checkout.commit} at {checkout.path}", flush=True)
            checkout_prepare(checkout, args.volunteers)

        print("loading (fresh processes):", flush=True)
        runs: dict[str, dict[str, list[dict]]] = {checkout.label: {"web": [], "worker": []} for checkout in checkouts}
        for _ in range(args.import_repeats):
            for kind in ("web", "worker"):
                for checkout in checkouts:
                    runs[checkout.label][kind].append(import_cost(checkout, kind))
        imports = {label: {kind: {**measured[-1], "seconds": statistics.median(one["seconds"] for one in measured),
                                  "seconds_each": [one["seconds"] for one in measured]}
                           for kind, measured in kinds.items()}
                   for label, kinds in runs.items()}
        for label, kinds in imports.items():
            for kind, figures in kinds.items():
                print(f"  {label:<6} {kind:<6} {figures['seconds']:.2f} s (median of "
                      f"{', '.join(f'{seconds:.2f}' for seconds in figures['seconds_each'])}), {figures['modules']} modules, "
                      f"{figures['rss_mb']:.1f} MB, heavy: {heavy_shown(figures['heavy'])}", flush=True)

        print(f"serving ({args.requests} mixed requests, then requests/s), {args.rounds} round(s):", flush=True)
        rounds: dict[str, dict[int, list[dict]]] = {checkout.label: {count: [] for count in args.workers}
                                                    for checkout in checkouts}
        for _ in range(args.rounds):
            for workers in args.workers:
                for checkout in checkouts:
                    rounds[checkout.label][workers].append(server_measure(checkout, workers, args))
        servers = {label: {count: server_summary(results) for count, results in by.items()} for label, by in rounds.items()}

        figures = figures_table(imports, servers, args.workers)
        print(f"\nbefore = {baseline.commit} (--baseline {args.baseline}), after = {current.commit}; medians of "
              f"{args.import_repeats} loads and {args.rounds} server round(s); {uptime()}")
        print(f"{'':<44} {'unit':<8} {'before':>18} {'after':>18} {'after/before':>12}")
        for figure in figures:
            print(figure.line())
        if args.json:
            args.json.write_text(json.dumps({
                "command": " ".join(["python -m bench.webtier", *sys.argv[1:]]),
                "cpus": os.cpu_count(),
                "checkouts": {checkout.label: {"commit": checkout.commit, "path": str(checkout.path)} for checkout in checkouts},
                "figures": [{"name": figure.name, "unit": figure.unit, "before": figure.before, "after": figure.after,
                             "after_over_before": figure.ratio} for figure in figures],
                "imports": imports,
                "servers": {label: {str(workers): result for workers, result in by.items()} for label, by in servers.items()},
            }, indent=2))
            print(f"wrote {args.json}")
    finally:
        if redis is not None:
            redis.stop()
        checkout_baseline_remove(baseline_path)
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
