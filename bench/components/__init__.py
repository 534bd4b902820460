"""The components floor, beside `leakbench.defenses`, `leakbench.datasets` and
`leakbench.attacks.priors`: the model zoo (`models`), the architecture changes defenses make
(`bottleneck`), per-example gradients (`per_example`), the image metrics and LPIPS (`metrics`,
`lpips`, `lpips_weights`) and the per-image leakage flags (`leakage`)."""
