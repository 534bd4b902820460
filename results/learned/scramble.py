"""A test defense: each gradient tensor scrambled by a fixed secret permutation and sign flips.

It is invertible by whoever holds the secret, so it protects nothing from an attacker who can
learn its effect; the gradient-matching attacks, which compare the model's own gradient with the
shared one, cannot. It declares no adaptive attack on purpose: the learned attack
(`leakbench.attacks.learned`) must break it through the defense as a black box.
"""

import numpy as np
import tensorflow as tf

from leakbench.defenses import function_defense

# The server never learns this number; the learned attack never reads it.
SECRET = 0x5EC2E7


@function_defense("scramble")
def scramble(grads):
    out = []
    for k, g in enumerate(grads):
        size = int(np.prod(g.shape))
        rng = np.random.default_rng([SECRET, k, size])
        order = tf.constant(rng.permutation(size))
        signs = tf.constant(rng.choice(np.array([-1.0, 1.0]), size), g.dtype)
        out.append(tf.reshape(tf.gather(tf.reshape(g, [-1]), order) * signs, g.shape))
    return out
