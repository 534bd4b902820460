"""The engine version: which code produced a stored number.

A trial's key hashes its configuration, and the configuration alone does not say which code
computed the numbers: a fix to an optimiser, a defense or a random stream changes the numbers
of the same configuration. ``ENGINE_VERSION`` is part of every trial and training key and is
recorded in every store and ``environment.json``, so a store made by other code is never
silently reused: `leakbench.run.rundir.prepare_out_dir` refuses a run directory of another engine
version, and ``merge`` refuses shards of one.

Raise ``ENGINE_VERSION`` in the commit that changes any number an attack, a defense, a model,
the training or a random stream produces for an unchanged config, and add a line below.

History:

1. Every run before engine versions existed (stores without a recorded version).
2. 2026-12-01: the layered redesign; the training's defense draws got a stream of their own
   (`leakbench.core.seeds.training_draw`), apart from the observed gradient's; ``restarts`` split
   into ``retries`` and ``starts``; L-BFGS stop reasons and a stall window, and ``dlg`` /
   ``idlg`` defaults that run to their own convergence test (cap 10,000 iterations).
3. 2026-12-01: BatchNorm runs in training mode, as Keras trains (batch statistics in every
   gradient; training updates the moving statistics); models without BatchNorm (lenet, mlp)
   give the numbers of version 2.
4. 2026-12-01: fair utility: the utility models train on the training split less a validation
   split, once per learning rate of a declared search (the best on validation is kept), with
   ``training.seeds`` replicates and a DP recipe for example-level defenses; the threat
   model's ``train_steps`` use the first listed learning rate. Attacks give the numbers of
   version 3.
5. 2026-12-01: ``ig``'s defaults are the Inverting Gradients reference's published settings in
   pixel units (``lr = 0.025``, ``tv = 0.8`` with the reference's zero padding as
   ``tv_padding = "mean"``, Gaussian starts as ``init = "gaussian"``). ``convnet`` now pools
   with ``TiledMaxPooling2D``, whose second derivative XLA computes exactly (XLA's
   ``MaxPoolGradGrad`` compares bfloat16-rounded inputs; `docs/xla_gradients.md`); its numbers
   are bit for bit those of ``MaxPooling2D`` outside XLA, which the engine does not use for
   ``convnet``. Every other attack, every defense and the training give the numbers of
   version 4.
6. 2026-12-03: protocol 1 of the attack suite (`leakbench.attacks.suite`): every defense meets
   every attack family and its adaptive attacks (new trials; the listed ones keep their keys),
   the judge reruns an optimisation attack that stopped well above the true input's matching
   loss with more budget and fresh starts (`leakbench.run.judge`), which changes the numbers of
   such trials; the ``l1`` matching loss. Trials that converged give the numbers of version 5.
7. 2026-12-04: a defense with a DP accountant (``dpsgd``, a chain holding it) trains as its
   accountant analyses: Poisson-sampled batches, the noisy sum over the expected batch size, an
   empty batch releasing the noise alone, and each rate of the learning-rate search with its
   own batches and noise (`leakbench.client.training.run_epochs`); utility rows gain
   ``epsilon_search``. Every attack, every other defense's training and the pre-attack
   training give the numbers of version 6.
"""

from __future__ import annotations

ENGINE_VERSION = 7
# What a store without a recorded version was made by.
UNVERSIONED = 1
