"""CAS throughput: put and get MB/s of each provider beside plain boto3 and a plain file copy.

Run: python bench/cas.py  (starts its own moto S3 server and CAS server; takes a few minutes)
Workloads: 1 x 256 MiB and 2,000 x 64 KiB blobs, file to file. Prints a table per workload.

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
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import boto3  # noqa: E402
from helpers.s3 import free_port, start_moto, stop, wait_until_answers  # noqa: E402

from piloop_common.cas.cached import CachedStore  # noqa: E402
from piloop_common.cas.config import S3CasConfig  # noqa: E402
from piloop_common.cas.http import HttpStore  # noqa: E402
from piloop_common.cas.local import LocalStore  # noqa: E402
from piloop_common.cas.s3 import S3Store  # noqa: E402

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

Timed = tuple[float, float]  # put seconds, get seconds


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


def run_store(store_factory: Callable[[], object], files: list[Path], out: Path) -> Timed:
    store = store_factory()
    start = time.perf_counter()
    addresses = [store.put_file(f) for f in files]  # type: ignore[attr-defined]
    put = time.perf_counter() - start
    out.mkdir(parents=True)
    start = time.perf_counter()
    for i, a in enumerate(addresses):
        store.get_file(a, out / str(i))  # type: ignore[attr-defined]
    get = time.perf_counter() - start
    shutil.rmtree(out)
    return put, get


def run_boto3(client: object, files: list[Path], out: Path) -> Timed:
    prefix = uuid.uuid4().hex
    start = time.perf_counter()
    for i, f in enumerate(files):
        client.upload_file(str(f), BUCKET, f"{prefix}/{i}")  # type: ignore[attr-defined]
    put = time.perf_counter() - start
    out.mkdir(parents=True)
    start = time.perf_counter()
    for i in range(len(files)):
        client.download_file(BUCKET, f"{prefix}/{i}", str(out / str(i)))  # type: ignore[attr-defined]
    get = time.perf_counter() - start
    shutil.rmtree(out)
    return put, get


def run_copy(files: list[Path], work: Path) -> Timed:
    there, back = work / "there", work / "back"
    there.mkdir(parents=True)
    back.mkdir(parents=True)
    start = time.perf_counter()
    for i, f in enumerate(files):
        shutil.copyfile(f, there / str(i))
    put = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(len(files)):
        shutil.copyfile(there / str(i), back / str(i))
    get = time.perf_counter() - start
    shutil.rmtree(work)
    return put, get


def table(title: str, total: int, rows: dict[str, Timed], rss: dict[str, float]) -> str:
    # MB/s here means MiB/s: the bytes moved over the seconds taken.
    rate = {name: (total / MiB / p, total / MiB / g) for name, (p, g) in rows.items()}
    b_put, b_get = rate["boto3 (moto)"]
    c_put, c_get = rate["file copy"]
    lines = [
        f"### {title}",
        "",
        "| provider | put MB/s | get MB/s | put ÷ boto3 | get ÷ boto3 | put ÷ copy | get ÷ copy | peak RSS after |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, (p, g) in rate.items():
        lines.append(
            f"| {name} | {p:.0f} | {g:.0f} | {p / b_put:.2f} | {g / b_get:.2f} | {p / c_put:.2f} | {g / c_get:.2f} | {rss[name]:.0f} MiB |"
        )
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
        "cached over http (get: a hit)": lambda: CachedStore(HttpStore(cached_url, token=TOKEN), work / f"cache-{tag}",
                                                            max_bytes=10**10),
    }
    store = factories[name]() if name in factories else None
    base = reset_peak_rss()
    if name == "boto3 (moto)":
        put, get = run_boto3(client, files, work / "out")
    elif name == "file copy":
        put, get = run_copy(files, work / "copy")
    else:
        put, get = run_store(lambda: store, files, work / "out")
    shutil.rmtree(work, ignore_errors=True)
    return {"put_seconds": put, "get_seconds": get, "bytes": sum(f.stat().st_size for f in files),
            "rss_before_mib": base, "rss_peak_mib": peak_rss_mib()}


def measure(s3_url: str, urls: tuple[str, str], work: Path, count: int, size: int) -> dict[str, dict[str, float]]:
    """Every provider on `count` files of `size` bytes, each in a process of its own; MB/s (MiB/s) and RSS."""
    inputs = make_files(work / f"in-{count}x{size}", count, size)[0].parent
    out = {}
    try:
        for name in PROVIDERS:
            got = subprocess.run([sys.executable, __file__, "--one", name, "--inputs", str(inputs), "--work",
                                  str(work / "w"), "--s3", s3_url, "--http", urls[0], "--http-cached", urls[1]],
                                 capture_output=True, text=True, check=True)
            r = json.loads(got.stdout)
            out[name] = {"put_mbs": r["bytes"] / MiB / r["put_seconds"], "get_mbs": r["bytes"] / MiB / r["get_seconds"],
                         "rss_before_mib": r["rss_before_mib"], "rss_peak_mib": r["rss_peak_mib"]}
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    return out


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
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.inputs, a.work, a.s3, a.http, a.http_cached)))
        return
    with tempfile.TemporaryDirectory(prefix="piloop-bench-") as tmp, start_moto() as s3_url:
        work = Path(tmp)
        client = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        servers: list[subprocess.Popen[bytes]] = []
        try:
            # Two CAS servers, so that the cached row does not find the http row's blobs already there.
            url, cached_url = serve_cas(work / "served", servers), serve_cas(work / "served-for-cache", servers)

            def s3() -> S3Store:
                return S3Store(S3CasConfig(provider="s3", bucket=BUCKET, prefix=f"{uuid.uuid4().hex}/", endpoint_url=s3_url))

            def cached() -> CachedStore:
                return CachedStore(HttpStore(cached_url, token=TOKEN), work / f"cache-{uuid.uuid4().hex}", max_bytes=10**10)

            providers: dict[str, Callable[[], object]] = {
                "local": lambda: LocalStore(work / f"local-{uuid.uuid4().hex}"),
                "s3 (moto)": s3,
                "http": lambda: HttpStore(url, token=TOKEN),
                "cached over http (get: a hit)": cached,
            }
            workloads = [("1 × 256 MiB", 1, 256 * MiB), ("2,000 × 64 KiB", 2000, 64 * 1024)]
            for title, count, size in workloads:
                files = make_files(work / f"in-{count}", count, size)
                rss_before = peak_rss_mib()
                rows, rss = {}, {}
                for name, factory in providers.items():
                    rows[name], rss[name] = run_store(factory, files, work / "out"), peak_rss_mib()
                rows["boto3 (moto)"], rss["boto3 (moto)"] = run_boto3(client, files, work / "out"), peak_rss_mib()
                rows["file copy"], rss["file copy"] = run_copy(files, work / "copy"), peak_rss_mib()
                print(table(title, count * size, rows, rss))
                print(f"\npeak RSS of this process: {rss_before:.0f} MiB before, {peak_rss_mib():.0f} MiB after\n")
                shutil.rmtree(work / f"in-{count}")
        finally:
            for server in servers:
                stop(server)


if __name__ == "__main__":
    for _name, _value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                          "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(_name, _value)
    main()
