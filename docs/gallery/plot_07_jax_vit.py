"""
A JAX training loop: a Stiefel vision transformer with optax
============================================================

geoarray in JAX: the vision transformer of Brantner, *Generalizing Adam to Manifolds for Efficiently
Training Transformers*, on scikit-learn's digits, with the query/key/value weights of every head on
:math:`\\mathrm{St}(16, 4)`. Parameters and optimizer state are pytrees; the manifold Adam is an optax
``GradientTransformation`` (:func:`geoarray.jax.optax_transform`) chained after optax's gradient clipping;
:func:`geoarray.jax.make_train_step` compiles one step — ``jax.value_and_grad`` of the loss, the
optimizer's update, the retraction — with ``jax.jit``. The page needs ``jax`` and ``optax``
(``pip install 'geoarray-ml[jax]'``).
"""

import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import geoarray as ga
import geoarray.jax as gj

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size
jax.config.update("jax_enable_x64", True)  # float64, as the numpy pages

# %%
# Data and model
# --------------
# The same calls as on NumPy, with ``xp=jnp``: geoarray's code is written once against the array API,
# and the arrays it returns are JAX arrays.

images, labels = ga.data.load_digits(xp=jnp)
(x_train, l_train), (x_test, l_test) = ga.data.train_test_split(images, labels, test_fraction=0.25, seed=0)
x_train, t_train = ga.data.patches(x_train, 4), ga.data.one_hot(l_train, 10)
x_test = ga.data.patches(x_test, 4)
if SMOKE:
    x_train, t_train = x_train[:128], t_train[:128]

blocks, epochs = (1, 2) if SMOKE else (2, 15)
batch = 64
model = ga.models.ClassificationTransformer(16, 4, 10, n_heads=4, n_layers=blocks, stiefel=True)
params = model.init(0, xp=jnp)
manifolds = model.manifolds()
loss_fn = ga.nn.ClassificationL2Loss()
print(type(params[0]["PQ"]).__name__, params[0]["PQ"].shape, manifolds[0]["PQ"])

# %%
# The optimizer and the compiled step
# -----------------------------------
# ``optax_transform(manifolds, "adam", lr=...)`` is Algorithm 1 as an optax transformation: it
# needs the parameters in its ``update`` (``updates, state = opt.update(grads, state, params)``) because
# the lift to the global tangent space depends on the point, and :func:`geoarray.jax.apply_updates`
# (which ``make_train_step`` calls) moves by retraction on the manifold leaves and adds on the others.
# Clipping by global norm before it acts on the Euclidean gradients.


def loss(params, batch):
    x, t = batch
    return loss_fn(model.apply(params, x), t)


optimizer = optax.chain(optax.clip_by_global_norm(1.0), gj.optax_transform(manifolds, "adam", lr=3e-3))
train_step, state = gj.make_train_step(loss, optimizer, params)
predict = jax.jit(lambda params, x: jnp.argmax(model.apply(params, x), axis=-1))

# %%
# The loop
# --------
# Plain Python over epochs and batches; each step is one call of the jitted function (full batches only,
# so it compiles once).

rng = np.random.default_rng(0)
n_batches = x_train.shape[0] // batch
history = []
for epoch in range(1, epochs + 1):
    order = jnp.asarray(rng.permutation(x_train.shape[0]))
    total = 0.0
    for b in range(n_batches):
        idx = order[b * batch : (b + 1) * batch]
        params, state, value = train_step(params, state, (x_train[idx], t_train[idx]))
        total += float(value)
    accuracy = float(jnp.mean(predict(params, x_test) == l_test))
    history.append((epoch, total / n_batches, accuracy))
    print(f"epoch {epoch:2d}: training loss {total / n_batches:.4f}, test accuracy {accuracy:.3f}")

W = params[0]["PQ"]
print("max |WᵀW − I| of block 1's W_Q:", float(jnp.max(jnp.abs(jnp.swapaxes(W, -1, -2) @ W - jnp.eye(4)))))

# %%
# The training loss and the test accuracy per epoch, from the loop's own record.

epoch, train_loss, accuracy = np.asarray(history).T
fig, ax = plt.subplots(figsize=(5.5, 3.5))
ax.plot(epoch, train_loss, marker="o", ms=3, label="training loss")
ax.plot(epoch, accuracy, marker="s", ms=3, label="test accuracy")
ax.set(xlabel="epoch", title=f"JAX + optax, Stiefel ViT, {blocks} blocks")
ax.legend()
fig.tight_layout()
