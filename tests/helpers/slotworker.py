"""A stand-in worker for the slot supervisor's tests: a process that holds a `SlotHandle`, starts one job on it and
then does nothing, so a test can SIGKILL it as it would a worker.

    python -m tests.helpers.slotworker <slotdir> <generation> <seconds to its deadline> <argv...>

Prints `started <pid>` once the supervisor says the job started.
"""

from __future__ import annotations

import sys
import time

from piloop_worker import clock
from piloop_worker.slots import SlotDir, SlotHandle, SlotRequest
from piloop_worker.slots.wire import Started


def main() -> None:
    root, generation, seconds, *argv = sys.argv[1:]
    h = SlotHandle(SlotDir(root))
    h.open()
    h.start(int(generation), "job", "token", clock.now() + float(seconds), SlotRequest(argv=argv, kill_grace=0.5))
    while True:
        for msg in h.read(timeout=5):
            if isinstance(msg, Started):
                print(f"started {msg.pid}", flush=True)
                while True:
                    time.sleep(60)


if __name__ == "__main__":
    main()
