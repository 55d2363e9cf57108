#!/opt/python/bin/python3
"""`minio server DIR [--address :9000] [--console-address …]` answered by moto's S3 server, for the compose stack
where MinIO's image cannot be pulled.

moto keeps its state in memory. Its recorder is what persists it here: every request is appended to
DIR/moto-recording.jsonl (on the service's volume), and a restarted server replays that file into itself before it
says it is ready (/tmp/minio-ready, which `mc ready local` reads). So the bucket, its objects and the user outlive
`docker compose down` and `up`, as MinIO's volume would. The console address is accepted and not served."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

READY = Path("/tmp/minio-ready")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "server" or len(argv) < 2:
        print("usage: minio server DIR [--address :9000] [--console-address :9001]", file=sys.stderr)
        return 2
    data, port = Path(argv[1]), 9000
    rest = argv[2:]
    if "--address" in rest:
        port = int(rest[rest.index("--address") + 1].rpartition(":")[2])
    data.mkdir(parents=True, exist_ok=True)
    recording = data / "moto-recording.jsonl"
    os.environ["MOTO_RECORDER_FILEPATH"] = str(recording)
    READY.unlink(missing_ok=True)

    from moto.moto_api import recorder
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    # one writer at a time: a large object's line is more than one write, and the server answers in threads
    lock = threading.Lock()
    record = recorder._record_request

    def record_locked(*a, **k):  # type: ignore[no-untyped-def]
        with lock:
            return record(*a, **k)

    recorder._record_request = record_locked  # type: ignore[method-assign]

    server = ThreadedMotoServer(ip_address="0.0.0.0", port=port, verbose=False)
    server.start()
    if recording.exists() and recording.stat().st_size:
        started = time.monotonic()
        recorder.replay_recording(target_host=f"http://127.0.0.1:{port}")
        lines = sum(1 for _ in recording.open())
        print(f"minio(moto): replayed {lines} requests in {time.monotonic() - started:.1f}s", flush=True)
    recorder.start_recording()
    READY.write_text(str(os.getpid()))
    print(f"minio(moto): S3 on :{port}, state in {recording}", flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
