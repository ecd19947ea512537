"""Cross-process JAX: gtrain's jax launcher has already called jax.distributed.initialize() when this runs.
Each process sums its index + 1 across all processes (psum) and fits a tiny linear model with pmap."""

import argparse

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
args = ap.parse_args()

n = jax.local_device_count()
total = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(jnp.full((n,), jax.process_index() + 1.0))
print(f"jax process {jax.process_index()} of {jax.process_count()} devices {jax.device_count()} "
      f"psum {float(total[0])}", flush=True)


def loss(w, x):
    return jnp.mean((x @ w - x.sum(1)) ** 2)


step = jax.pmap(lambda w, x: w - 0.1 * jax.lax.pmean(jax.grad(loss)(w, x), "i"), axis_name="i")
w = jnp.zeros((n, 4))
key = jax.random.PRNGKey(jax.process_index())
for _ in range(args.steps):
    key, sub = jax.random.split(key)
    w = step(w, jax.random.normal(sub, (n, 32, 4)))
print(f"jax process {jax.process_index()} trained: loss {float(loss(w[0], jnp.ones((1, 4)))):.4f}", flush=True)
