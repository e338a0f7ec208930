"""What the SGD experiments train: problems with a flat parameter vector and per-worker batches.

- ``convex``: dense least squares, ``X w ≈ y`` with a planted ``w*`` and noise; the optimum
  ``w_opt`` is the least-squares solution, so the distance to it is measurable.
- ``sparse``: least squares where each example touches ``k`` of ``d`` coordinates, the
  setting Hogwild! (Niu et al. 2011) was made for: updates rarely collide.
- ``mlp``: a small torch MLP (64-64-10) on scikit-learn's digits (8x8 images, shipped
  inside the package: no network access), cross-entropy, train/test accuracy.

Every problem exposes ``dim``, ``init(seed)``, ``batch(worker, step)`` (deterministic in
the seed, worker and step, so BSP on p workers can be checked against one process on
the combined batch), ``grad(w, idx) -> (loss, g)``, ``loss(w)`` on the full training
set, and ``sparse_grad`` for Hogwild's coordinate-wise writes.
"""

from __future__ import annotations

import numpy as np

from netmorph.errors import UsageError

MODELS = ("convex", "sparse", "mlp")


class LeastSquares:
    name = "convex"

    def __init__(self, n=4096, d=64, batch=32, seed=0, noise=0.1):
        rng = np.random.default_rng(seed)
        self.X = rng.standard_normal((n, d)) / np.sqrt(d)  # (n, d)
        self.w_star = rng.standard_normal(d)
        self.y = self.X @ self.w_star + noise * rng.standard_normal(n)  # (n,)
        self.w_opt = np.linalg.lstsq(self.X, self.y, rcond=None)[0]
        self.n, self.dim, self.bs, self.seed = n, d, batch, seed

    def init(self, seed=0):
        return np.zeros(self.dim)

    def batch(self, worker, step):
        return np.random.default_rng((self.seed, worker, step)).integers(0, self.n, self.bs)

    def grad(self, w, idx):
        Xb, yb = self.X[idx], self.y[idx]  # (B, d), (B,)
        r = Xb @ w - yb
        return 0.5 * float(r @ r) / len(idx), Xb.T @ r / len(idx)

    def loss(self, w):
        r = self.X @ w - self.y
        return 0.5 * float(r @ r) / self.n

    def metrics(self, w):
        return {"distance_to_optimum": float(np.linalg.norm(w - self.w_opt)), "optimal_loss": self.loss(self.w_opt)}


class SparseLeastSquares(LeastSquares):
    """Each example has ``k`` non-zeros out of ``d``: a gradient touches k coordinates."""

    name = "sparse"

    def __init__(self, n=8192, d=4096, k=8, batch=1, seed=0, noise=0.1):
        rng = np.random.default_rng(seed)
        self.cols = np.stack([rng.choice(d, k, replace=False) for _ in range(n)])  # (n, k)
        self.vals = rng.standard_normal((n, k)) / np.sqrt(k)  # (n, k)
        self.w_star = rng.standard_normal(d)
        self.y = (self.vals * self.w_star[self.cols]).sum(1) + noise * rng.standard_normal(n)
        self.n, self.dim, self.bs, self.k, self.seed = n, d, batch, k, seed
        self.w_opt = None

    def _dense(self, idx):
        X = np.zeros((len(idx), self.dim))
        np.put_along_axis(X, self.cols[idx], self.vals[idx], axis=1)
        return X

    def sparse_grad(self, w, idx):
        """(loss, coordinates, values): the gradient restricted to the coordinates it touches."""
        c, v = self.cols[idx], self.vals[idx]  # (B, k)
        r = (v * w[c]).sum(1) - self.y[idx]  # (B,)
        g = v * r[:, None] / len(idx)  # (B, k)
        return 0.5 * float(r @ r) / len(idx), c.reshape(-1), g.reshape(-1)

    def grad(self, w, idx):
        loss, c, g = self.sparse_grad(w, idx)
        full = np.zeros(self.dim)
        np.add.at(full, c, g)
        return loss, full

    def loss(self, w):
        r = (self.vals * w[self.cols]).sum(1) - self.y
        return 0.5 * float(r @ r) / self.n

    def metrics(self, w):
        return {"distance_to_planted": float(np.linalg.norm(w - self.w_star) / np.sqrt(self.dim))}


class DigitsMLP:
    """64-64-10 MLP on scikit-learn's digits (1797 images), as one flat float64 parameter vector."""

    name = "mlp"

    def __init__(self, batch=32, seed=0, hidden=64):
        import torch
        from sklearn.datasets import load_digits

        torch.set_num_threads(1)  # one rank, one core: intra-op threads would fight the other ranks
        d = load_digits()
        X = (d.data / 16.0).astype(np.float32)  # (1797, 64)
        y = d.target.astype(np.int64)
        rng = np.random.default_rng(1234)
        perm = rng.permutation(len(X))
        split = int(0.8 * len(X))
        tr, te = perm[:split], perm[split:]
        self.Xtr, self.ytr = torch.from_numpy(X[tr]), torch.from_numpy(y[tr])
        self.Xte, self.yte = torch.from_numpy(X[te]), torch.from_numpy(y[te])
        self.n, self.bs, self.seed, self.hidden = len(tr), batch, seed, hidden
        self.shapes = [(hidden, 64), (hidden,), (10, hidden), (10,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.sizes)
        self.torch = torch

    def init(self, seed=0):
        rng = np.random.default_rng(seed)
        parts = [
            rng.standard_normal(self.shapes[0]) / np.sqrt(64),
            np.zeros(self.hidden),
            rng.standard_normal(self.shapes[2]) / np.sqrt(self.hidden),
            np.zeros(10),
        ]
        return np.concatenate([p.reshape(-1) for p in parts])

    def _unflat(self, w):
        t = self.torch.from_numpy(np.asarray(w, dtype=np.float32).copy()).requires_grad_(True)
        out, at = [], 0
        for shp, n in zip(self.shapes, self.sizes):
            out.append(t[at : at + n].view(shp))
            at += n
        return t, out

    def _forward(self, parts, X):
        W1, b1, W2, b2 = parts
        h = self.torch.relu(X @ W1.T + b1)  # (B, hidden)
        return h @ W2.T + b2  # (B, 10)

    def batch(self, worker, step):
        return np.random.default_rng((self.seed, worker, step)).integers(0, self.n, self.bs)

    def grad(self, w, idx):
        t, parts = self._unflat(w)
        i = self.torch.from_numpy(idx)
        loss = self.torch.nn.functional.cross_entropy(self._forward(parts, self.Xtr[i]), self.ytr[i])
        loss.backward()
        return float(loss.detach()), t.grad.numpy().astype(np.float64)

    def loss(self, w):
        with self.torch.no_grad():
            _, parts = self._unflat(w)
            return float(self.torch.nn.functional.cross_entropy(self._forward(parts, self.Xtr), self.ytr))

    def metrics(self, w):
        with self.torch.no_grad():
            _, parts = self._unflat(w)
            acc = (self._forward(parts, self.Xte).argmax(1) == self.yte).float().mean()
        return {"test_accuracy": float(acc)}


_BUILT: dict = {}


def make(model: str, batch: int | None = None, seed: int = 0):
    """The problem, built once per process: the launcher builds it before the ranks fork, so
    they inherit the data (and torch, already imported) instead of loading it again."""
    key = (model, batch, seed)
    if key not in _BUILT:
        _BUILT[key] = _make(model, batch, seed)
    return _BUILT[key]


def _make(model: str, batch: int | None, seed: int):
    if model == "convex":
        return LeastSquares(batch=batch or 32, seed=seed)
    if model == "sparse":
        return SparseLeastSquares(batch=batch or 1, seed=seed)
    if model == "mlp":
        return DigitsMLP(batch=batch or 32, seed=seed)
    raise UsageError(f"{{model}} must be one of {', '.join(MODELS)}, got {model!r}", "model")
