"""Model zoo: shapes, seeded weights, and the explicit task loss."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.client.training import DefendedTrainer
from leakbench.components.forward import architecture_key, model_gradients, task_loss
from leakbench.components.models import MODELS, build_model
from leakbench.core.errors import ConfigError, UnknownNameError
from leakbench.defenses import make_defense


@pytest.mark.parametrize(
    ("shape", "flat"), [((32, 32, 3), 768), ((28, 28, 1), 588), ((8, 8, 1), 48), ((25, 25, 1), 588)]
)
def test_lenet_matches_the_dlg_paper_sizes(shape: tuple[int, int, int], flat: int) -> None:
    # PyTorch's Conv2d(k=5, padding=2, stride 2, 2, 1): 32 -> 16 -> 8 -> 8, so 8*8*12 = 768.
    model = build_model("lenet", shape, 10, seed=0)
    assert model.layers[-1].kernel.shape == (flat, 10)
    assert model(np.zeros((2, *shape), np.float32)).shape == (2, 10)


def test_lenet_weights_are_uniform_and_distinct_per_layer() -> None:
    model = build_model("lenet", (32, 32, 3), 10, seed=0)
    weights = model.get_weights()
    assert len(weights) == 8
    for w in weights:
        assert -0.5 <= w.min() and w.max() <= 0.5
    # The 2nd and 3rd convolutions have the same kernel shape: a shared seeded initializer
    # would make them identical.
    assert weights[2].shape == weights[4].shape
    assert not np.array_equal(weights[2], weights[4])


@pytest.mark.parametrize("name", MODELS.names("image"))
def test_weights_follow_the_seed(name: str) -> None:
    a = build_model(name, (8, 8, 1), 10, seed=3).get_weights()
    b = build_model(name, (8, 8, 1), 10, seed=3).get_weights()
    c = build_model(name, (8, 8, 1), 10, seed=4).get_weights()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_mlp_has_a_first_layer_bias() -> None:
    model = build_model("mlp", (8, 8, 1), 10, seed=0)
    kernel, bias = model.trainable_variables[:2]
    assert kernel.shape == (64, 256) and bias.shape == (256,)


def test_bad_model_arguments() -> None:
    with pytest.raises(UnknownNameError, match="lenet"):
        build_model("resnet1000", (8, 8, 1), 10, seed=0)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("lenet", (8, 8, 1), 1, seed=0)


def test_task_loss_equals_keras_cross_entropy_on_one_hot_labels() -> None:
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(4, 10)), tf.float32)
    labels = tf.one_hot([1, 3, 3, 9], 10)
    expected = keras.losses.CategoricalCrossentropy(from_logits=True)(labels, logits)
    assert float(task_loss(logits, labels)) == pytest.approx(float(expected), rel=1e-6)


def test_task_loss_has_the_right_second_derivative_for_soft_labels() -> None:
    """d/dy of the parameter gradient: what DLG's joint label optimisation differentiates.

    For logits z = a W and p = softmax(z), the loss -sum(y log p) has
    dL/dW_jk = a_j (p_k sum(y) - y_k), hence d(dL/dW_jk)/dy_m = a_j (p_k - [m == k]).
    """
    rng = np.random.default_rng(1)
    a = tf.constant(rng.uniform(0.1, 1.0, size=(1, 3)), tf.float64)
    w = tf.Variable(rng.normal(size=(3, 4)))
    y = tf.constant([[0.1, 0.2, 0.3, 0.4]], tf.float64)
    with tf.GradientTape() as outer:
        outer.watch(y)
        with tf.GradientTape() as inner:
            loss = task_loss(a @ w, y)
        grad_w = inner.gradient(loss, w)
        probe = grad_w[0, 2]  # j = 0, k = 2
    dy = outer.gradient(probe, y).numpy()[0]
    p = tf.nn.softmax(a @ w).numpy()[0]
    a0 = float(a[0, 0])
    np.testing.assert_allclose(dy, [a0 * p[2], a0 * p[2], a0 * (p[2] - 1), a0 * p[2]], rtol=1e-10)


def test_model_gradients_are_ordered_like_the_variables() -> None:
    model = build_model("lenet", (8, 8, 1), 10, seed=0)
    grads = model_gradients(model, tf.zeros((1, 8, 8, 1)), tf.one_hot([2], 10))
    assert [tuple(g.shape) for g in grads] == [tuple(v.shape) for v in model.trainable_variables]


# The BatchNorm + ReLU models (Geiping et al.'s ConvNet at width 8, a ResNet-8).
RELU_MODELS = ("convnet", "resnet")


@pytest.mark.parametrize("name", RELU_MODELS)
@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28, 1), (5, 7, 2)])
def test_relu_models_give_one_logit_row_per_image(name: str, shape: tuple[int, int, int]) -> None:
    model = build_model(name, shape, 10, seed=0)
    logits = model(np.random.default_rng(0).uniform(size=(3, *shape)).astype(np.float32))
    assert logits.shape == (3, 10)
    assert np.all(np.isfinite(logits))


@pytest.mark.parametrize(
    ("shape", "flat"), [((32, 32, 3), 288), ((28, 28, 1), 288), ((16, 16, 3), 32), ((5, 7, 2), 32)]
)
def test_convnet_follows_the_inverting_gradients_layout(
    shape: tuple[int, int, int], flat: int
) -> None:
    # Two 3x3 max pools of stride 3 after "same" convolutions: 32 -> 10 -> 3 and 28 -> 9 -> 3
    # give 3*3*32 = 288 features, 16 -> 5 -> 1 gives 32; below 9 pixels the windows shrink
    # (5 -> 1 -> 1, 7 -> 2 -> 1), so every input size keeps one feature per channel.
    model = build_model("convnet", shape, 10, seed=0)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [c.filters for c in convs] == [8, 16, 16, 32, 32, 32, 32, 32]
    assert all(c.kernel_size == (3, 3) and c.use_bias for c in convs)
    assert sum(isinstance(layer, keras.layers.MaxPooling2D) for layer in model.layers) == 2
    assert sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers) == 8
    assert model.layers[-1].kernel.shape == (flat, 10)


def test_resnet_has_three_residual_stages() -> None:
    model = build_model("resnet", (32, 32, 3), 10, seed=0)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    # The stem, two per block, and 1x1 projections where 16 -> 32 and 32 -> 64 channels.
    assert [c.filters for c in convs if c.kernel_size == (3, 3)] == [16, 16, 16, 32, 32, 64, 64]
    assert [c.filters for c in convs if c.kernel_size == (1, 1)] == [32, 64]
    assert not any(c.use_bias for c in convs)
    assert sum(isinstance(layer, keras.layers.Add) for layer in model.layers) == 3
    # Strides 1, 2, 2: 32 -> 32 -> 16 -> 8 before the global average pool.
    pool = next(lay for lay in model.layers if isinstance(lay, keras.layers.GlobalAveragePooling2D))
    assert tuple(pool.input.shape) == (None, 8, 8, 64)
    assert model.layers[-1].kernel.shape == (64, 10)


@pytest.mark.parametrize(
    ("name", "count"),
    # The widths of the papers: the counts of Geiping et al.'s ConvNet (width 64) and of the
    # CIFAR ResNet-18 in PyTorch.
    [("convnet", 48_634), ("resnet", 78_042), ("convnet64", 2_904_970), ("resnet18", 11_173_962)],
)
def test_relu_models_parameter_counts(name: str, count: int) -> None:
    """Trainable parameters for 32x32x3 inputs and 10 classes, counted by hand.

    convnet: convolutions 3*8*9+8 + 8*16*9+16 + 16*16*9+16 + 16*32*9+32 + 4*(32*32*9+32)
    = 45,344; BatchNorm 2*(8+16+16+5*32) = 400; dense 288*10+10 = 2,890.
    resnet: stem 3*16*9 = 432; blocks 2*16*16*9 = 4,608, 16*32*9+32*32*9+16*32 = 14,336 and
    32*64*9+64*64*9+32*64 = 57,344; BatchNorm 2*(16+2*16+3*32+3*64) = 672; dense 64*10+10 = 650.
    """
    model = build_model(name, (32, 32, 3), 10, seed=0)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == count


@pytest.mark.parametrize("name", RELU_MODELS)
def test_relu_models_draw_distinct_bounded_weights(name: str) -> None:
    model = build_model(name, (16, 16, 3), 10, seed=0)
    kernels, biases = [], []
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            kernel = layer.kernel.numpy()
            fan_in = int(np.prod(kernel.shape[:-1]))
            conv = isinstance(layer, keras.layers.Conv2D)
            limit = np.sqrt(6 / fan_in) if conv else np.sqrt(6 / (fan_in + kernel.shape[-1]))
            assert np.abs(kernel).max() <= limit
            kernels.append(kernel)
            if layer.use_bias:
                biases.append(layer.bias.numpy())
                assert np.abs(biases[-1]).max() <= 1 / np.sqrt(fan_in)
        elif isinstance(layer, keras.layers.BatchNormalization):
            np.testing.assert_array_equal(layer.gamma.numpy(), 1.0)
            np.testing.assert_array_equal(layer.beta.numpy(), 0.0)
            np.testing.assert_array_equal(layer.moving_mean.numpy(), 0.0)
            np.testing.assert_array_equal(layer.moving_variance.numpy(), 1.0)
    # Several layers share a shape (e.g. the convnet's five 3x3x32x32 kernels): each must
    # still get its own draw.
    for group in (kernels, biases):
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                assert a.shape != b.shape or not np.array_equal(a, b)


@pytest.mark.parametrize("name", RELU_MODELS)
def test_relu_models_seeds_and_architecture_key(name: str) -> None:
    a = build_model(name, (16, 16, 3), 10, seed=5)
    b = build_model(name, (16, 16, 3), 10, seed=5)
    c = build_model(name, (16, 16, 3), 10, seed=6)
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)
    # Every drawn variable (kernels, biases) differs between seeds.
    for x, z in zip(a.trainable_variables, c.trainable_variables, strict=True):
        if "gamma" not in x.path and "beta" not in x.path:
            assert not np.array_equal(x.numpy(), z.numpy()), x.path
    assert architecture_key(a) == architecture_key(c)
    other = "resnet" if name == "convnet" else "convnet"
    assert architecture_key(a) != architecture_key(build_model(other, (16, 16, 3), 10, seed=5))


def test_batch_norm_is_a_fixed_affine_map_in_inference_mode() -> None:
    """With the initial moving statistics (mean 0, variance 1), BatchNorm computes
    gamma * x / sqrt(1 + 1e-5) + beta, so the examples of a batch do not interact."""
    model = build_model("convnet", (16, 16, 3), 10, seed=0)
    bn = next(lay for lay in model.layers if isinstance(lay, keras.layers.BatchNormalization))
    bn.gamma.assign(np.linspace(0.5, 2.0, 8).astype(np.float32))
    bn.beta.assign(np.linspace(-1.0, 1.0, 8).astype(np.float32))
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype(np.float32)
    expected = x * np.linspace(0.5, 2.0, 8) / np.sqrt(1 + 1e-5) + np.linspace(-1.0, 1.0, 8)
    np.testing.assert_allclose(bn(x, training=False), expected, rtol=1e-5, atol=1e-6)
    images = np.random.default_rng(1).uniform(size=(2, 16, 16, 3)).astype(np.float32)
    together = model(images, training=False)
    alone = model(images[:1], training=False)
    np.testing.assert_allclose(together[:1], alone, rtol=1e-5, atol=1e-6)


def test_utility_training_learns_every_moving_statistic_of_a_resnet() -> None:
    """The train step runs in training mode, as Keras trains: gamma and beta learn, and every
    BatchNorm layer's moving mean and variance move from 0 and 1 (tests/test_batchnorm.py
    checks the values for the convnet)."""
    model = build_model("resnet", (8, 8, 3), 4, seed=0)
    trainer = DefendedTrainer(
        model, make_defense("none"), keras.optimizers.SGD(0.1), num_classes=4, seed=0
    )
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(size=(4, 8, 8, 3)), tf.float32)
    result = trainer.step(images, tf.constant([0, 1, 2, 3]))
    assert not bool(result.skipped)
    norms = [lay for lay in model.layers if isinstance(lay, keras.layers.BatchNormalization)]
    assert any(not np.array_equal(bn.gamma.numpy(), 1.0) for bn in norms)
    for bn in norms:
        assert not np.allclose(bn.moving_mean.numpy(), 0.0), bn.name
        assert not np.allclose(bn.moving_variance.numpy(), 1.0), bn.name


@pytest.mark.parametrize("name", RELU_MODELS)
def test_relu_model_gradients_are_finite_and_ordered(name: str) -> None:
    model = build_model(name, (16, 16, 3), 10, seed=0)
    images = tf.constant(np.random.default_rng(2).uniform(size=(2, 16, 16, 3)), tf.float32)
    grads = model_gradients(model, images, tf.one_hot([7, 1], 10))
    assert len(grads) == len(model.trainable_variables)
    for g, v in zip(grads, model.trainable_variables, strict=True):
        assert g.shape == v.shape and np.all(np.isfinite(g)), v.path
    # The logits' bias gradient of a mean cross-entropy sums to zero over the classes.
    assert abs(float(tf.reduce_sum(grads[-1]))) < 1e-6


# The first attack on an architecture traces and XLA-compiles its L-BFGS loop: 15-35 s per
# model on 2 loaded CPU cores, whatever the input size.
@pytest.mark.slow
@pytest.mark.parametrize("name", RELU_MODELS)
def test_relu_models_can_be_attacked(name: str) -> None:
    shape, classes = (16, 16, 3), 10
    model = build_model(name, shape, classes, seed=0)
    image = tf.constant(np.random.default_rng(2).uniform(size=(1, *shape)), tf.float32)
    grads = model_gradients(model, image, tf.one_hot([7], classes))
    target = AttackTarget(model, tuple(grads), shape, 1, classes)
    rec = make_attack("idlg", iterations=5)(target, seed=0)
    assert rec.status == "ok" and rec.images.shape == (1, *shape)
    # ReLU features are non-negative, so iDLG reads the label off the last layer's gradient.
    assert rec.labels.tolist() == [7]


# The papers' widths, end to end through `leakbench run`: about a minute of XLA compilation
# for ResNet-18's 11 M parameters on 2 CPU cores.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["convnet64", "resnet18"])
def test_the_papers_models_run_through_leakbench_run(name: str, tmp_path) -> None:
    from leakbench.run.config import parse_config
    from leakbench.run.runner import run_benchmark

    # 16x16 digits: ResNet-18's last BatchNorm layers then see 2x2 features of the one example
    # (at 8x8 they would see one value per channel, which `leakbench.client.check_model` refuses).
    spec = parse_config(
        f'model = "{name}"\nsuite = "listed"\nimages = 1\nimage_size = [16, 16]\n'
        '[[attack]]\nname = "idlg"\niterations = 2\n[training]\nenabled = false\n'
    )
    trials = run_benchmark(spec, tmp_path / "out", progress=False).trials
    assert trials["status"].tolist() == ["ok"]
    assert trials["predicted_label"].tolist() == trials["label"].tolist()
