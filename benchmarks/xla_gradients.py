"""The matching objectives' input gradient under XLA against eager TensorFlow and float64.

Issue 19: at one starting point the image gradient of `ig`'s objective on `convnet`, compiled
with XLA, differed from eager TensorFlow by about 1%. This script measures, for `lenet`,
`convnet` and `resnet` and for `dlg`'s objective (squared L2, labels learned, as the paper) and
`ig`'s (one minus cosine plus total variation, labels known), the gradient of the objective
with respect to the dummy input, ``d loss / d z`` at one start point, computed

- eagerly in float32 (the reference of the comparison columns ``*_eager``),
- as a plain ``tf.function`` graph in float32 (how the engine runs `convnet` and `resnet`),
- XLA-compiled in float32 (``jit_compile=True``, how the engine runs `lenet`),
- eagerly and XLA-compiled in float64 (the same model with its float32 weights cast; the
  columns ``*_f64`` compare with the eager float64 gradient).

It reports the relative L2 error, the cosine and the number of image entries whose sign
differs, and ``kink``: how far the start point is from a kink of the ReLU models' forward pass
(the smallest absolute ReLU input, or gap between a pooling window's two largest inputs), within
float32 rounding of which two correct float32 programs can give input gradients a percent apart.
The row ``convnet+MaxPooling2D`` is `convnet` with Keras' own ``MaxPooling2D`` in place of
`leakbench.components.models.TiledMaxPooling2D`, the code before the fix: XLA's lowering of
``MaxPoolGradGrad`` has no float64 kernel, hence ``n/a``. ``--op`` first checks that op alone
on random ReLU-like input; ``--ig-iterations K`` also runs `ig` (Adam loop of the engine,
`leakbench.attacks.engine.matching.adam_matcher`) for K iterations from the same start on
every image, once XLA-compiled and once as a graph, for both convnet variants, and prints the
PSNRs.

The objectives are built by `leakbench.attacks.engine.matching.matching_objective` with the
arguments `ig` and `dlg` pass it (their default parameters). Images: scikit-image's
photographs resized to 32x32 RGB (no network), labels 0, 1, 2, ..., or CIFAR-10 test images
with ``--cifar10`` when Keras has them cached. Weights: each model at seed 0; the observed
gradient is the true image's. `docs/xla_gradients.md` has the results of

    PYTHONSAFEPATH=1 python benchmarks/xla_gradients.py --op --images 3
    PYTHONSAFEPATH=1 python benchmarks/xla_gradients.py --no-table --images 3 --ig-iterations 300
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks import make_attack
from leakbench.attacks.engine.matching import adam_matcher, matching_objective
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.kinks import kink_margin
from leakbench.components.models import TiledMaxPooling2D, build_model

SHAPE, CLASSES = (32, 32, 3), 10
MODELS = ("lenet", "convnet", "resnet", "convnet+MaxPooling2D")
Objective = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Models built inside are built in ``name`` (Keras' global policy, restored after)."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def with_keras_pooling(model: keras.Model) -> keras.Model:
    """``model`` (a Sequential `convnet`) with Keras' ``MaxPooling2D`` in place of every
    `TiledMaxPooling2D`: the same weights (the other layers are shared), the old pooling."""
    layers = [
        keras.layers.MaxPooling2D(
            layer.pool_size, layer.strides, layer.padding, dtype=layer.dtype_policy
        )
        if isinstance(layer, TiledMaxPooling2D)
        else layer
        for layer in model.layers
    ]
    return keras.Sequential([keras.Input(shape=model.input_shape[1:]), *layers])


def build(name: str, dtype: str) -> keras.Model:
    """Model ``name`` of `MODELS` at seed 0, in ``dtype`` (float64: the float32 draw, cast)."""
    base = name.split("+")[0]
    model = build_model(base, SHAPE, CLASSES, seed=0)
    if dtype != "float32":
        with dtype_policy(dtype):
            wide = build_model(base, SHAPE, CLASSES, seed=0)
        for target, source in zip(wide.weights, model.weights, strict=True):
            target.assign(np.asarray(source.numpy(), dtype))
        model = wide
    return with_keras_pooling(model) if name.endswith("+MaxPooling2D") else model


def images(count: int, cifar10: bool) -> tuple[np.ndarray, np.ndarray]:
    """``count`` 32x32x3 images in [0, 1] and their labels."""
    if cifar10:
        from leakbench.datasets import load_dataset

        test = load_dataset("cifar10").test
        return test.x[:count], test.y[:count]
    from skimage import data
    from skimage.transform import resize

    photos = (data.chelsea, data.astronaut, data.coffee, data.rocket)
    if count > len(photos):
        raise SystemExit(f"--images: at most {len(photos)} without --cifar10")
    x = np.stack([resize(p(), SHAPE[:2], anti_aliasing=True) for p in photos[:count]])
    return x.astype(np.float32), np.arange(count) % CLASSES


def objective_arguments(attack: str) -> dict:
    """The problem arguments `ig` and `dlg` (default parameters) give `matching_objective`,
    for one image whose labels the attacker learns (dlg) or knows (ig)."""
    a = make_attack(attack)
    common = dict(
        input_shape=SHAPE,
        batch_size=1,
        num_classes=CLASSES,
        match=a.match,
        priors=a.objective_priors(),
    )
    if attack == "ig":
        return dict(common, learn_labels=False, loss="cosine", starts=a.starts)
    return dict(common, learn_labels=True, loss=a.loss)


def objective(model: keras.Model, x: np.ndarray, y: np.ndarray, attack: str) -> Objective:
    """The attack's objective for the private batch ``x``, ``y`` (one problem, N = 1)."""
    dtype = model.trainable_variables[0].dtype
    onehot = tf.one_hot(y, CLASSES, dtype=dtype)
    observed = model_gradients(model, tf.constant(x, dtype), onehot)
    weights = tuple(tf.convert_to_tensor(v)[None] for v in model.trainable_variables)
    return matching_objective(
        model,
        weights,
        tuple(g[None] for g in observed),
        onehot[None],
        **objective_arguments(attack),
    )


def start(attack: str, seed: int) -> tf.Tensor:
    """The attack's kind of start point: U(0, 1) images (ig), N(0, 1) images and label
    logits (dlg)."""
    pixels = int(np.prod(SHAPE))
    if attack == "ig":
        return tf.random.stateless_uniform([1, pixels], seed=[seed, 0])
    return tf.random.stateless_normal([1, pixels + CLASSES], seed=[seed, 0])


def compare(a: np.ndarray, b: np.ndarray) -> tuple[float, float, int]:
    """Relative L2 error of ``a`` against ``b``, their cosine, and the entries whose sign
    differs."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return rel, cos, int(np.sum(np.sign(a) != np.sign(b)))


def input_gradient(fn: Objective, z: tf.Tensor) -> np.ndarray | None:
    """The image part of ``fn``'s gradient at ``z``, or None when XLA cannot compile it."""
    try:
        return fn(z)[1].numpy()[0, : int(np.prod(SHAPE))]
    except tf.errors.InvalidArgumentError as err:
        if "XLA" not in str(err) and "compile" not in str(err):
            raise
        return None


def gradient_table(x: np.ndarray, y: np.ndarray, seed: int) -> None:
    """One block of rows per image: every model, objective and mode."""
    header = (
        f"{'model':22s} {'objective':9s} {'mode':9s} {'rel_eager':>9s} {'cos_eager':>12s} "
        f"{'flips':>5s} {'rel_f64':>9s} {'cos_f64':>12s} {'flips64':>7s} {'kink':>8s}"
    )
    print(header)
    for name in MODELS:
        models = {dtype: build(name, dtype) for dtype in ("float32", "float64")}
        for attack in ("dlg", "ig"):
            z = start(attack, seed)
            # The same forward values with either pooling layer: measured on the zoo's model.
            images = tf.reshape(z[0, : int(np.prod(SHAPE))], (1, *SHAPE))
            kink = kink_margin(build(name.split("+")[0], "float32"), images)
            grads: dict[str, np.ndarray | None] = {}
            for dtype, model in models.items():
                fn = objective(model, x, y, attack)
                zz = tf.cast(z, dtype)
                bits = "" if dtype == "float32" else "64"
                grads["eager" + bits] = input_gradient(fn, zz)
                if dtype == "float32":
                    grads["graph"] = input_gradient(tf.function(fn), zz)
                grads["xla" + bits] = input_gradient(tf.function(fn, jit_compile=True), zz)
            for mode, g in grads.items():
                if g is None:
                    print(f"{name:22s} {attack:9s} {mode:9s} n/a (XLA cannot compile it)")
                    continue
                rel, cos, flips = compare(g, grads["eager"])
                rel64, cos64, flips64 = compare(g, grads["eager64"])
                print(
                    f"{name:22s} {attack:9s} {mode:9s} {rel:9.2e} {cos:12.9f} {flips:5d} "
                    f"{rel64:9.2e} {cos64:12.9f} {flips64:7d} {kink:8.1e}"
                )


def pool_op_check() -> None:
    """``MaxPoolGradGrad`` alone, 3x3 windows of stride 3 on [1, 30, 30, 32] ReLU-like input:
    eager TensorFlow against XLA, and whether every differing window is a near tie (its two
    largest inputs equal once rounded to bfloat16)."""
    rng = np.random.default_rng(0)
    x = tf.constant(np.maximum(rng.normal(size=(1, 30, 30, 32)), 0.0).astype(np.float32))
    v = tf.constant(rng.normal(size=x.shape).astype(np.float32))

    def gradgrad(x: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
        y = tf.nn.max_pool2d(x, 3, 3, "VALID")
        return tf.raw_ops.MaxPoolGradGrad(
            orig_input=x, orig_output=y, grad=v, ksize=[1, 3, 3, 1], strides=[1, 3, 3, 1],
            padding="VALID",
        )  # fmt: skip

    eager = gradgrad(x, v).numpy().ravel()
    xla = tf.function(gradgrad, jit_compile=True)(x, v).numpy().ravel()
    # Windows in the output's order [row, col, channel], inputs of each window last.
    windows = x.numpy().reshape(10, 3, 10, 3, 32).transpose(0, 2, 4, 1, 3).reshape(-1, 9)
    top = np.sort(windows, axis=1)[:, -2:]
    rounded = tf.cast(tf.cast(top, tf.bfloat16), tf.float32).numpy()
    near_tie = (rounded[:, 0] == rounded[:, 1]) & (top[:, 1] > 0)
    differ = eager != xla
    print(
        f"MaxPoolGradGrad, {eager.size} windows: {int(differ.sum())} differ under XLA "
        f"(relative error {np.linalg.norm(eager - xla) / np.linalg.norm(eager):.2e}); "
        f"{int(near_tie.sum())} near ties in bfloat16, {int((differ & near_tie).sum())} of them "
        f"differ; {int((differ & ~near_tie).sum())} differing windows are not near ties"
    )


def ig_psnrs(x: np.ndarray, y: np.ndarray, iterations: int) -> None:
    """`ig` from the same start on each image, the Adam loop XLA-compiled and as a graph."""
    attack = make_attack("ig", iterations=iterations)
    print(f"ig, {iterations} iterations, PSNR in dB per image (same start per image)")
    for name in ("convnet", "convnet+MaxPooling2D"):
        model = build(name, "float32")
        loop = adam_matcher(
            model,
            input_shape=SHAPE,
            batch_size=1,
            num_classes=CLASSES,
            iterations=attack.iterations,
            lr=attack.lr,
            signed=attack.signed,
            priors=attack.objective_priors(),
            starts=attack.starts,
            match=attack.match,
        )
        weights = tuple(tf.convert_to_tensor(v)[None] for v in model.trainable_variables)
        for mode in ("graph", "xla"):
            run = getattr(loop, mode)
            scores, began = [], time.perf_counter()
            for i in range(len(x)):
                onehot = tf.one_hot(y[i : i + 1], CLASSES)
                observed = model_gradients(model, tf.constant(x[i : i + 1]), onehot)
                result = run(
                    start("ig", i), weights, tuple(g[None] for g in observed), onehot[None]
                )
                image = result.x.numpy().reshape(1, *SHAPE)
                scores.append(float(metrics.psnr(metrics.mse(x[i : i + 1], image))[0]))
            seconds = time.perf_counter() - began
            print(f"  {name:22s} {mode:5s} " + " ".join(f"{s:6.2f}" for s in scores)
                  + f"   ({seconds:.0f} s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1, help="images (default 1)")
    parser.add_argument("--cifar10", action="store_true", help="CIFAR-10 test images")
    parser.add_argument("--op", action="store_true", help="check MaxPoolGradGrad alone first")
    parser.add_argument("--ig-iterations", type=int, default=0, help="also run ig (0: no)")
    parser.add_argument("--no-table", action="store_true", help="skip the gradient table")
    args = parser.parse_args()
    x, y = images(args.images, args.cifar10)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}")
    if args.op:
        pool_op_check()
    if not args.no_table:
        for i in range(len(x)):
            print(f"image {i} (label {int(y[i])}), start seed {i}")
            gradient_table(x[i : i + 1], y[i : i + 1], seed=i)
    if args.ig_iterations:
        ig_psnrs(x, y, args.ig_iterations)


if __name__ == "__main__":
    main()
