"""CAS throughput: put and get MB/s of each provider beside plain boto3 and a plain file copy.

Run: python bench/cas.py  (starts its own moto S3 server and CAS servers; takes a few minutes)
Workloads: 1 x 256 MiB and 2,000 x 64 KiB blobs, file to file. Prints a table per workload and round.
`--large-mb N`, `--small-count N` (0 skips the workload), `--providers NAME...` and `--repeat N` narrow or
repeat it: on a shared machine, compare providers measured in the same round (their ratio), over several
rounds; each round runs the providers in the opposite order of the last, so neither always goes first.

Each provider runs in a process of its own (`--one`), so its peak RSS is its own: the RSS before the workload
(the interpreter, boto3, the store) and the peak during it. The 256 MiB blob streams, so the peak stays far
below 256 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import boto3
from helpers.s3 import free_port, start_moto, stop, wait_until_answers

from piloop_common.cas.cached import CachedStore
from piloop_common.cas.config import S3CasConfig
from piloop_common.cas.http import HttpStore
from piloop_common.cas.local import LocalStore
from piloop_common.cas.s3 import S3Store

MiB = 1 << 20
BUCKET = "piloop-bench"
TOKEN = "plt_bench"
SERVE = """
import sys, uvicorn
from piloop_common.cas.local import LocalStore
from piloop_server.cas_app import create_cas_app
app = create_cas_app(LocalStore(sys.argv[1]), lambda t: t == sys.argv[3])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def serve_cas(root: Path, servers: list[subprocess.Popen[bytes]]) -> str:
    port = free_port()
    servers.append(subprocess.Popen([sys.executable, "-c", SERVE, str(root), str(port), TOKEN]))
    url = f"http://127.0.0.1:{port}"
    wait_until_answers(f"{url}/v1/cas/identity", servers[-1])
    return url


def _status(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, which starts again at exec (ru_maxrss keeps the forking parent's)."""
    hwm = _status("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> float:
    """Start the peak over from now (Linux: clear_refs 5 resets VmHWM to the current RSS); the RSS now."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status("VmRSS") or peak_rss_mib()


def make_files(directory: Path, count: int, size: int) -> list[Path]:
    directory.mkdir(parents=True)
    files = []
    for i in range(count):
        path = directory / f"{i:05d}"
        with open(path, "wb") as f:
            for offset in range(0, size, 16 * MiB):
                f.write(os.urandom(min(16 * MiB, size - offset)))
        files.append(path)
    return files


class Stopwatch:
    """Wall seconds and this process's CPU seconds (every thread) of each phase: on a loaded machine the wall
    clock swings with the neighbours' load, a client's CPU seconds much less."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name], self.cpu[name] = time.perf_counter() - wall, time.process_time() - cpu


def run_store(store: object, files: list[Path], out: Path, clock: Stopwatch) -> None:
    with clock.phase("put"):
        addresses = [store.put_file(f) for f in files]  # type: ignore[attr-defined]
    out.mkdir(parents=True)
    with clock.phase("get"):
        for i, a in enumerate(addresses):
            store.get_file(a, out / str(i))  # type: ignore[attr-defined]
    shutil.rmtree(out)


def run_boto3(client: object, files: list[Path], out: Path, clock: Stopwatch) -> None:
    prefix = uuid.uuid4().hex
    with clock.phase("put"):
        for i, f in enumerate(files):
            client.upload_file(str(f), BUCKET, f"{prefix}/{i}")  # type: ignore[attr-defined]
    out.mkdir(parents=True)
    with clock.phase("get"):
        for i in range(len(files)):
            client.download_file(BUCKET, f"{prefix}/{i}", str(out / str(i)))  # type: ignore[attr-defined]
    shutil.rmtree(out)


def run_copy(files: list[Path], work: Path, clock: Stopwatch) -> None:
    there, back = work / "there", work / "back"
    there.mkdir(parents=True)
    back.mkdir(parents=True)
    with clock.phase("put"):
        for i, f in enumerate(files):
            shutil.copyfile(f, there / str(i))
    with clock.phase("get"):
        for i in range(len(files)):
            shutil.copyfile(there / str(i), back / str(i))
    shutil.rmtree(work)


def table(title: str, rows: dict[str, dict[str, float]]) -> str:
    """One round's MB/s (MiB/s: the bytes moved over the seconds taken), its ratios and the RSS each process added."""
    lines = [
        f"### {title}",
        "",
        "| provider | put MB/s | get MB/s | put ÷ boto3 | get ÷ boto3 | put ÷ copy | get ÷ copy | put, get CPU s "
        "| RSS added |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in rows.items():
        cells = [name, f"{r['put_mbs']:.0f}", f"{r['get_mbs']:.0f}"]
        for peer in ("boto3 (moto)", "file copy"):
            for op in ("put_mbs", "get_mbs"):
                cells.append(f"{r[op] / rows[peer][op]:.2f}" if peer in rows else "-")
        cells.append(f"{r['put_cpu_s']:.2f}, {r['get_cpu_s']:.2f}")
        cells.append(f"{r['rss_peak_mib'] - r['rss_before_mib']:.0f} MiB")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


PROVIDERS = ("local", "s3 (moto)", "http", "cached over http (get: a hit)", "boto3 (moto)", "file copy")


def one(name: str, inputs: Path, work: Path, s3_url: str, http_url: str, cached_url: str) -> dict[str, float]:
    """One provider's put and get of every file in `inputs`, in this process: seconds and RSS (MiB)."""
    files = sorted(p for p in inputs.iterdir() if p.is_file())
    work.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    client = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")
    factories: dict[str, Callable[[], object]] = {
        "local": lambda: LocalStore(work / f"local-{tag}"),
        "s3 (moto)": lambda: S3Store(S3CasConfig(provider="s3", bucket=BUCKET, prefix=f"{tag}/", endpoint_url=s3_url)),
        "http": lambda: HttpStore(http_url, token=TOKEN),
        "cached over http (get: a hit)": lambda: CachedStore(
            HttpStore(cached_url, token=TOKEN), work / f"cache-{tag}", max_bytes=10**10
        ),
    }
    store = factories[name]() if name in factories else None
    base = reset_peak_rss()
    clock = Stopwatch()
    if name == "boto3 (moto)":
        run_boto3(client, files, work / "out", clock)
    elif name == "file copy":
        run_copy(files, work / "copy", clock)
    else:
        run_store(store, files, work / "out", clock)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "put_seconds": clock.wall["put"],
        "get_seconds": clock.wall["get"],
        "put_cpu_seconds": clock.cpu["put"],
        "get_cpu_seconds": clock.cpu["get"],
        "bytes": sum(f.stat().st_size for f in files),
        "rss_before_mib": base,
        "rss_peak_mib": peak_rss_mib(),
    }


def measure(
    s3_url: str,
    urls: tuple[str, str],
    work: Path,
    count: int,
    size: int,
    providers: tuple[str, ...] = PROVIDERS,
    repeat: int = 1,
) -> dict[str, dict[str, float]]:
    """Every provider on `count` files of `size` bytes, each in a process of its own; MB/s (MiB/s) and RSS.

    With `repeat`, the median of the rounds (each figure on its own; `rounds` lists them all)."""
    rounds = measure_rounds(s3_url, urls, work, count, size, providers, repeat)
    out = {}
    for name in providers:
        runs = [r[name] for r in rounds]
        out[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out


def measure_rounds(
    s3_url: str,
    urls: tuple[str, str],
    work: Path,
    count: int,
    size: int,
    providers: tuple[str, ...] = PROVIDERS,
    repeat: int = 1,
) -> list[dict[str, dict[str, float]]]:
    """`repeat` rounds of every provider on the same input files; odd rounds go in reverse order."""
    inputs = make_files(work / f"in-{count}x{size}", count, size)[0].parent
    rounds = []
    try:
        for i in range(repeat):
            out = {}
            for name in providers if i % 2 == 0 else providers[::-1]:
                got = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        name,
                        "--inputs",
                        str(inputs),
                        "--work",
                        str(work / "w"),
                        "--s3",
                        s3_url,
                        "--http",
                        urls[0],
                        "--http-cached",
                        urls[1],
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                r = json.loads(got.stdout)
                out[name] = {
                    "put_mbs": r["bytes"] / MiB / r["put_seconds"],
                    "get_mbs": r["bytes"] / MiB / r["get_seconds"],
                    "put_cpu_s": r["put_cpu_seconds"],
                    "get_cpu_s": r["get_cpu_seconds"],
                    "rss_before_mib": r["rss_before_mib"],
                    "rss_peak_mib": r["rss_peak_mib"],
                }
            rounds.append({name: {**out[name], "load": os.getloadavg()[0]} for name in providers})
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    return rounds


def start_servers(work: Path, s3_url: str, servers: list[subprocess.Popen[bytes]]) -> tuple[str, str]:
    """The bench bucket on the S3 endpoint, and two CAS servers (`piloop cas serve`'s app), so that the cached row
    does not find the http row's blobs already there; their URLs."""
    client = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return serve_cas(work / "served", servers), serve_cas(work / "served-for-cache", servers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", choices=PROVIDERS)
    ap.add_argument("--inputs", type=Path)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--s3")
    ap.add_argument("--http")
    ap.add_argument("--http-cached")
    ap.add_argument("--large-mb", type=int, default=256, help="the large blob's size in MiB (0 skips it)")
    ap.add_argument("--small-count", type=int, default=2000, help="how many 64 KiB blobs (0 skips them)")
    ap.add_argument("--providers", nargs="+", choices=PROVIDERS, help="only these (default: all)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of each workload")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.inputs, a.work, a.s3, a.http, a.http_cached)))
        return
    providers = tuple(a.providers) if a.providers else PROVIDERS
    workloads = [
        (f"1 × {a.large_mb} MiB", 1, a.large_mb * MiB),
        (f"{a.small_count:,} × 64 KiB", a.small_count, 64 * 1024),
    ]
    with tempfile.TemporaryDirectory(prefix="piloop-bench-") as tmp, start_moto() as s3_url:
        work = Path(tmp)
        servers: list[subprocess.Popen[bytes]] = []
        try:
            urls = start_servers(work, s3_url, servers)
            for title, count, size in workloads:
                if count == 0 or size == 0:
                    continue
                rounds = measure_rounds(s3_url, urls, work, count, size, providers, a.repeat)
                for i, r in enumerate(rounds, 1):
                    load = next(iter(r.values()))["load"]
                    print(table(f"{title}, round {i} of {len(rounds)} (load average {load:.1f} after it)", r))
                    print()
                if len(rounds) > 1 and "boto3 (moto)" in providers:
                    print(ratios(title, rounds))
                    print()
        finally:
            for server in servers:
                stop(server)


def ratios(title: str, rounds: list[dict[str, dict[str, float]]]) -> str:
    """Each provider's put and get over boto3's of the same round: every round, and their median."""
    lines = [
        f"### {title}: ÷ boto3 of the same round",
        "",
        "| provider | put, each round | put median | get, each round | get median |",
        "| --- | --- | ---: | --- | ---: |",
    ]
    for name in rounds[0]:
        row = [name]
        for op in ("put_mbs", "get_mbs"):
            each = [r[name][op] / r["boto3 (moto)"][op] for r in rounds]
            row += [" ".join(f"{x:.2f}" for x in each), f"{statistics.median(each):.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for _name, _value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(_name, _value)
    main()
