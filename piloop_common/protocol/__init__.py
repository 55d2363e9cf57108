"""The wire records: every API message as a pydantic model, used on both sides.

`worker` holds a worker's calls and what every message shares (`Message`, `PROTOCOL`, the id patterns);
`report` its reports and log appends; `operator` the CLI's and the Python client's calls; `campaign` and
`schedule` theirs. Nothing here imports another layer of piloop_common but its basics."""
