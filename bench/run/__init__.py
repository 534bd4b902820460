"""The run floor: a config becomes a run directory. `config` (the TOML schema), `plan` (every
trial and training, keyed), `execute` with its backends (`dispatch`, `workers`; Ray in
`leakbench.integrations`), the run directory (`rundir`, `store`, `lock`, `shard`, `merge`),
the per-image identification of stored reconstructions (`identification`) and `runner`, which
joins them (`leakbench.run.runner.run_benchmark`)."""
