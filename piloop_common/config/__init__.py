"""The configuration: `settings` (the models of the whole `config.toml` tree) with `network`, `provisioner` and
`docker` (their tables), `load` (`load_settings`: file, environment, `PILOOP_PLUGINS`), `check` and `schema`
(`piloop config check` and `schema`), and `reference` (docs/configuration.md, generated from the models)."""
