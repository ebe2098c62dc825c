"""Algorithm 1 of Rosasco et al. (2010), eq. 14–17, written as printed: every product with K, Z and L
taken afresh, the stopping norms evaluated from their definitions.  The test of DerivativeSelector's
iterates and the benchmark of its speed (experiments/bench_derivative.py) compare against it."""
import math

import torch

from alacarte.selection.derivative import _gram_blocks, _top_eigenvalue


def paper_iteration(z, yc, tau, mu, gamma, tol, max_iter, max_inner_iter):
    """(α, β, outer iterations, inner iterations) on standardised inputs ``z`` and centred targets ``yc``
    (float64 tensors); β is ordered by input j, as in the docstring of DerivativeSelector."""
    n, d = z.shape
    K, Z, L = _gram_blocks(z, gamma)
    sigma = (_top_eigenvalue(K) + mu) / 2
    shrink = 1 - mu / (2 * sigma)
    eta = 1.0 / _top_eigenvalue(L)
    radius = tau / (2 * sigma)

    def h_norm(da, db):  # ‖S*δα + ∇̂*δβ‖_H
        return math.sqrt(max(float(da @ (K @ da) + 2 * da @ (Z @ db) + db @ (L @ db)), 0.0) / n)

    alpha = torch.zeros(n, dtype=torch.float64)
    beta = torch.zeros(n * d, dtype=torch.float64)
    v = torch.zeros(n * d, dtype=torch.float64)
    inner_total = 0
    for it in range(1, max_iter + 1):
        alpha_new = shrink * alpha - (K @ alpha + Z @ beta - yc) / (2 * sigma)
        beta_half = shrink * beta
        offset = L @ beta_half / radius + Z.T @ alpha_new / radius
        for _ in range(max_inner_iter):
            inner_total += 1
            g = (L @ v - offset).reshape(d, n)
            v_new = ((v.reshape(d, n) - eta * g) / (1 + eta * g.square().mean(1).sqrt())[:, None]).reshape(-1)
            dv, v = v_new - v, v_new
            if math.sqrt(max(float(dv @ (L @ dv)), 0.0) / n) <= tol:
                break
        beta_new = beta_half - radius * v
        step = h_norm(alpha_new - alpha, beta_new - beta)
        alpha, beta = alpha_new, beta_new
        if step <= tol:
            break
    return alpha, beta, it, inner_total
