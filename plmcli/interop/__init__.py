"""plm runs <-> other libraries' checkpoints. `plmcli.interop.hf` drives transformers directories.

A family takes part by implementing, on its model class, `hf_model_types`, `to_hf(run_config)` and
`from_hf(hf_config, state_dict)` (the `ExportsHF` protocol of plmcli.models.base); the naming helpers several
of those share are in plmcli.models.hf_names, below this package, so that models never import interop.
"""
