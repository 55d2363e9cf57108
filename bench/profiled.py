"""Run a module under a profiler and write its stats when it exits (SIGTERM included):

    python bench/profiled.py cprofile|yappi OUT -m module [args...]

cProfile sees the main thread only (the worker's loop); yappi sees every thread (the server's handlers run in a
thread pool). Both count CPU time, not wall time (`PROFILE_CLOCK=wall` for wall time). Read the stats with
`python -m pstats OUT`.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys


def main() -> None:
    kind, out, flag, module, *rest = sys.argv[1:]
    assert flag == "-m", "usage: profiled.py cprofile|yappi OUT -m module [args...]"
    sys.argv = [module, *rest]
    wall = os.environ.get("PROFILE_CLOCK") == "wall"
    if kind == "yappi":
        import yappi

        yappi.set_clock_type("wall" if wall else "cpu")
        yappi.start()

        def dump() -> None:
            yappi.stop()
            yappi.get_func_stats().save(out, type="pstat")

        atexit.register(dump)
        # a SIGTERM that the program does not handle itself still ends through atexit
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        import cProfile
        import time

        prof = cProfile.Profile() if wall else cProfile.Profile(time.process_time)
        try:
            prof.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        finally:
            prof.dump_stats(out)


if __name__ == "__main__":
    main()
