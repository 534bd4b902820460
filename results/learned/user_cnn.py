"""Trains the ReLU CNN a user might bring (results/learned/user-cnn.keras).

Two 3x3 ReLU convolutions (16 and 32 channels, each followed by 2x2 max pooling), a dense ReLU
layer of 64 and a linear output: 136,874 parameters. Trained with Adam (1e-3, batch 64, 8
epochs) on the public split of the CIFAR-10 test archive (the 7,500 images the private ones
are not drawn from; leakbench's split of ../shared/data/cifar10/cifar10-test.npz), so the
model has never seen a private image. Usage, from the repository root:

    python results/learned/user_cnn.py
"""

from pathlib import Path

import keras
import numpy as np

from leakbench.datasets import load_dataset

HERE = Path(__file__).parent
DATA = HERE.parents[2] / "shared" / "data" / "cifar10" / "cifar10-test.npz"


def main() -> None:
    keras.utils.set_random_seed(0)
    data = load_dataset(f"npz:{DATA}")
    model = keras.Sequential(
        [
            keras.Input(data.input_shape),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(data.num_classes),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(data.train.x, data.train.y, batch_size=64, epochs=8, verbose=2)
    _, accuracy = model.evaluate(data.test.x, data.test.y, verbose=0)
    print(f"{model.count_params():,} parameters; accuracy on the private split {accuracy:.3f}")
    model.save(HERE / "user-cnn.keras")
    np.savetxt(HERE / "user-cnn-accuracy.txt", [accuracy], fmt="%.4f")


if __name__ == "__main__":
    main()
