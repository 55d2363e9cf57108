"""What a worker reads of its own host: the sample each heartbeat carries (`sample`), the cgroup's memory limit
(`cgroupmem`), and the health record `piloop worker check` reads (`health`). Only the worker and its CLI use them."""
