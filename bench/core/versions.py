"""The engine version: which code produced a stored number.

A trial's key hashes its configuration, and the configuration alone does not say which code
computed the numbers: a fix to an optimiser, a defense or a random stream changes the numbers
of the same configuration. ``ENGINE_VERSION`` is part of every trial and training key and is
recorded in every store and ``environment.json``, so a store made by other code is never
silently reused: `leakbench.run.rundir.prepare_out_dir` refuses a run directory of another engine
version, and ``merge`` refuses shards of one.

Raise ``ENGINE_VERSION`` in the commit that changes any number an attack, a defense, a model,
the training or a random stream produces for an unchanged config, and add a line below. The
client check's thresholds (`leakbench.components.dsnr.KIND_THRESHOLDS`) count: a stored trial's
detection columns were judged by them (`tests/test_engine_version.py` holds each engine's).

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
8. 2026-12-05: the ``cosine`` matching loss (`leakbench.attacks.engine.losses.cosine_distance`,
   and the text attacks' ``loss = "cosine"``) is computed as half the squared distance of the
   unit-length gradients instead of ``1 - dot / norms``, whose float32 value is rounding noise
   below about 1e-7: every trial of an attack with the cosine loss changes (``ig`` by its last
   digits; ``dlg`` and ``idlg`` with ``loss = "cosine"``, the adaptive attacks against clipping
   and DP-SGD, now recover what they stalled short of), and the judge's cosine reference is 1/2.
   Every other trial and every training give the numbers of version 7. On 2026-12-07 the
   client check's thresholds became per layer kind within this version, before the guard on
   them existed: a detecting run's store of engine 8 made before then holds flags of the
   model-name thresholds (every committed one was made again).
9. 2026-12-07: fair utility budgets (protocol 2, issue 67): a learning-rate search whose best
   rate is the lowest or highest of its grid goes on past that edge, one geometric step at a
   time, up to ``training.edge_extensions`` (2) more rates (`leakbench.client.selection`), and
   ``training.dp.epochs`` defaults to ``training.epochs``. Utility trainings whose grid winner
   was at an edge change (a DP search composes the extra runs into ``epsilon_search``); every
   attack, defense and the pre-attack training give the numbers of version 8.

`EVALUATION_FIXES` lists the fixes that made attacks stronger: a result of an older engine may
say "holds" where the fixed attack succeeds, so the board flags it (`weak_evaluation`).
"""

from __future__ import annotations

ENGINE_VERSION = 9
# What a store without a recorded version was made by.
UNVERSIONED = 1

# (the first engine with the fix, what the engines before it did wrong): fixes that made an
# attack of the standard suite stronger.
EVALUATION_FIXES: tuple[tuple[int, str], ...] = (
    (
        6,
        "it ran each defense's listed attacks only, without the standard suite's adaptive "
        "attacks, and nothing reran an optimisation attack that stopped well above the true "
        "input's matching loss (the judge of engine 6)",
    ),
    (
        8,
        "its cosine matching loss lost its float32 precision near a match, so the attacks "
        "with loss = cosine (ig, and the adaptive attacks against clipping and DP-SGD) "
        "stopped short of what they recover since engine 8",
    ),
)


def weak_evaluation(engine: object) -> str:
    """Why a result made by ``engine`` (an engine version, or what a file recorded for one) was
    judged by weaker attacks than this engine's: empty when it was not; for an engine that was
    not recorded, the fixes it may predate."""
    try:
        number = int(str(engine))
    except ValueError:
        number = UNVERSIONED
    reasons = [why for fixed, why in EVALUATION_FIXES if number < fixed]
    return "; ".join(f"engine {number}: {why}" for why in reasons)
