"""The Python API behind `piloop_common.tasks`: `tasks` (`Client`, `Task`, `@task`), `canvas` (chains, groups,
periodic tasks), `taskresult` (`AsyncResult`), `taskoptions`, `taskcode` (shipping a task's code), `nested` (a
job's own calls through its worker's relay), and the HTTP client every caller uses: `client` (`ApiClient`) and
`remote` (a remote server's URL, TLS and token)."""
