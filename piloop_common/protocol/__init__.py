"""The wire records: every API message as a pydantic model, used on both sides.

`message` holds what every message shares (`Message`, the id patterns); `spec` a job's spec and its checks;
`worker` a worker's calls and `PROTOCOL` (and re-exports both, which callers import from there); `report` a
worker's reports and log appends; `operator` the CLI's and the Python client's calls; `campaign` and `schedule`
theirs. Nothing here imports another layer of piloop_common but its basics."""
