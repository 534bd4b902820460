"""The ground floor: what every other floor may use and which imports nothing of leakbench
above it. Errors a user can cause (`errors`), the registries and their entry-point plugins
(`registry`, `plugins`), declared parameters (`params`), canonical JSON (`canonical`), seed
derivation (`seeds`), the engine version (`versions`), the federated-training settings
(`federated`) and the description of the machine a run was made on (`environment`)."""
