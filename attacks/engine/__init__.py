"""The attack engine: what optimisation attacks are built from.

* `leakbench.attacks.engine.matching`: the gradient-matching objective (matching losses, the
  adaptive "kept" mask, the priors of `leakbench.attacks.priors`) and the compiled loops that
  minimise it for many trials at once;
* `leakbench.attacks.engine.lbfgs` and `leakbench.attacks.engine.adam`: the optimisers, batched
  over problems, with their whole state passed in and out;
* `leakbench.attacks.engine.lanes`: continuous batching of L-BFGS problems (slots refilled as
  trials finish);
* `leakbench.attacks.engine.functional`: the batched functional copy of a Keras model (one set
  of weights per problem) that lets one program attack several trials.

The engine knows models, but no attack, defense, dataset or anything of the application
(config, runner, store, outputs).
"""
