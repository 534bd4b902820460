"""Audit your own Keras model: train a small classifier on digits with plain Keras, save it,
and ask leakbench how much its shared gradients leak under two defenses.

    PYTHONSAFEPATH=1 python examples/audit_your_model.py --out runs/audit-example

The same audit from the command line: ``leakbench run OUT/config.toml --out OTHER`` (the
config `leakbench.audit` wrote) gives the same trials. Run it again with the same ``--out`` and
the finished trials are reused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import keras

import leakbench
from leakbench.datasets import load_dataset


def train(epochs: int) -> keras.Model:
    """A small convolutional classifier of the 8x8 digits, trained with Keras's own loop."""
    digits = load_dataset("digits")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(digits.input_shape),
            keras.layers.Conv2D(8, 3, padding="same", activation="sigmoid"),
            keras.layers.Flatten(),
            keras.layers.Dense(digits.num_classes, activation="softmax"),
        ],
        name="my_digits_model",
    )
    model.compile(
        keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    model.fit(digits.train.x, digits.train.y, epochs=epochs, batch_size=32, verbose=0)
    _, accuracy = model.evaluate(digits.test.x, digits.test.y, verbose=0)
    print(f"trained {epochs} epochs: test accuracy {accuracy:.1%}")
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/audit-example"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--images", type=int, default=4, help="private digits to attack")
    args = parser.parse_args(argv)

    model = train(args.epochs)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "my_model.keras"
    model.save(saved)  # what a training script leaves behind

    digits = load_dataset("digits")
    result = leakbench.audit(
        saved,  # or the model object itself
        digits.test.x[: args.images],
        digits.test.y[: args.images],
        defenses=["none", {"name": "gaussian", "sigma": 0.01}],
        attacks=[{"name": "idlg", "iterations": 300}],
        out=args.out / "run",
    )
    columns = ["attack", "defense", "defense_params", "psnr_median", "leaked_rate", "verdict"]
    print(result.leaderboard[columns].to_string(index=False))
    if result.figure is not None:
        figure = args.out / "reconstructions.png"
        result.figure.savefig(figure, dpi=200)
        print(f"reconstructions: {figure}")
    print(f"{result.ran} trials run, {result.reused} reused; run directory {result.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
