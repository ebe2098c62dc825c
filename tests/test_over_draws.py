"""fit_over_draws: a fit of the mean marginal likelihood over fresh feature draws, against models whose
kernels were built with those seeds."""
import copy

import numpy as np
import torch

import alacarte as ac
from alacarte.selection._over_draws import _OverDraws, fit_over_draws
from alacarte.training import negative_mll
from selection_cases import built_with


def _fitted(seed: int = 2):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 5))
    y = np.sin(2 * x[:, 0]) * x[:, 3] + 0.1 * rng.standard_normal(300)
    kernel = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, seed=seed).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=30, restarts=0, progress=False, seed=0)
    return model, kernel


def _loss_and_grads(model):
    model.train()
    model.zero_grad()
    with model.inference_settings():
        loss = negative_mll(model, model.train_inputs[0], model.train_targets, backward=True)
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def test_the_objective_is_the_mean_over_models_built_with_those_seeds(single_thread):
    """Value and gradients (π's too, where the π step differentiates the value itself) are the mean
    of those of models built with the seeds; the model keeps its own draw."""
    model, kernel = _fitted()
    own = {name: buffer.clone() for name, buffer in kernel.named_buffers()}
    seeds = [11, 12, 13]
    references = [_loss_and_grads(built_with(model, seed)) for seed in seeds]
    mean_loss = sum(loss for loss, _ in references) / len(seeds)
    mean_grads = [sum(grads[i] for _, grads in references) / len(seeds) for i in range(len(references[0][1]))]
    objective = _OverDraws(model, kernel, seeds, max_iter=1, tolerance=0.0)
    model.train()
    with model.inference_settings():
        model.zero_grad()
        loss = objective._loss(backward=True)
        assert abs(float(loss) - mean_loss) <= 1e-12 * abs(mean_loss)
        for p, reference in zip(model.parameters(), mean_grads):
            assert torch.allclose(p.grad, reference, rtol=1e-9, atol=1e-12)
        surrogate = objective._loss(backward=False)
        (pi_grad,) = torch.autograd.grad(surrogate, [kernel.simplex_weights])
        pi_index = [name for name, _ in model.named_parameters()].index("covar_module.simplex_weights")
        assert abs(float(surrogate) - mean_loss) <= 1e-12 * abs(mean_loss)
        assert torch.allclose(pi_grad, mean_grads[pi_index], rtol=1e-9, atol=1e-12)
    assert all(torch.equal(buffer, own[name]) for name, buffer in kernel.named_buffers())


def test_fit_over_draws_lowers_the_mean_over_those_draws_and_keeps_the_models_draw(single_thread):
    """The fit lowers the mean loss of the models built with the seeds below where the fit on the model's
    own draw left it, to where its gradient in the smooth parameters is a tenth of what it was; π stays on the
    simplex; the model's own draw is the one it had."""
    model, kernel = _fitted()
    own = {name: buffer.clone() for name, buffer in kernel.named_buffers()}
    seeds = [11, 12, 13]

    def mean_over_seeds(m):
        results = [_loss_and_grads(built_with(m, seed)) for seed in seeds]
        grads = [sum(g[i] for _, g in results) / len(seeds) for i in range(len(results[0][1]))]
        return sum(loss for loss, _ in results) / len(seeds), grads

    names = [name for name, _ in model.named_parameters()]

    def steepest(grads):
        return max(float(g.abs().max()) for name, g in zip(names, grads) if name != "covar_module.simplex_weights")

    start, grads_before = mean_over_seeds(model)
    losses = fit_over_draws(model, kernel, seeds, max_iter=60)
    end, grads = mean_over_seeds(model)
    assert abs(losses[0] - start) <= 1e-9 * abs(start)
    assert end < start - 0.1  # nats per point: the own draw's fit is far from the draws' optimum
    assert steepest(grads) < 0.1 * steepest(grads_before)
    pi = kernel.simplex_weights.detach()
    assert bool((pi >= 0).all()) and abs(float(pi.sum()) - 1.0) <= 1e-12
    assert all(torch.equal(buffer, own[name]) for name, buffer in kernel.named_buffers())


def test_select_inputs_asks_at_the_draws_optimum_and_leaves_the_model_its_own_fit(single_thread, monkeypatch):
    """With fresh draws every cost is read where the mean likelihood over those draws is near stationary
    (a tenth of its steepest slope at the model's own fit, or less); with no round allowed to change
    anything the model comes back bit for bit, its own draw and fit."""
    from alacarte.selection import evidence
    from selection_cases import two_sines

    rng = np.random.default_rng(3)
    x, y = two_sines(rng, 300, 5)
    kernel = ac.FSARDKernel(5, 32, ard_num_dims=5, simplex=True, seed=4).double()
    model = ac.FeatureGP(None, None, kernel).double()
    ac.fit(model, x, y, max_iter=30, restarts=0, progress=False, seed=0, validation_fraction=0)
    seeds = evidence.fresh_seeds(kernel, evidence.FRESH_DRAWS)
    names = [name for name, _ in model.named_parameters()]

    def steepest(m) -> float:
        results = [_loss_and_grads(built_with(m, seed)) for seed in seeds]
        grads = [sum(g[i] for _, g in results) for i in range(len(names))]
        return max(float(g.abs().max()) / len(seeds) for name, g in zip(names, grads)
                   if name != "covar_module.simplex_weights")

    at_fit = steepest(model)
    read = []
    real = evidence.input_costs
    monkeypatch.setattr(evidence, "input_costs", lambda m, k, draws=(): read.append(steepest(m)) or real(m, k, draws))
    before = copy.deepcopy(model.state_dict())
    evidence.select_inputs(model, x, y, refit_iter=40, max_rounds=0, validation_fraction=0)
    assert read and read[0] < 0.1 * at_fit
    after = model.state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    read.clear()
    result = evidence.select_inputs(model, x, y, refit_iter=40, validation_fraction=0)
    assert result.selected.tolist() == [0, 1]
    assert len(read) == result.rounds + 1 and all(slope < 0.1 * at_fit for slope in read)


def test_a_drop_decided_at_the_draws_point_leaves_the_model_a_weight_to_refit():
    """Where the model's own fit has all its weight on inputs the draws' point drops, the inputs left
    start level, and the dropped ones are held at exactly 0."""
    from alacarte.selection.evidence import _apply

    kernel = ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=True, seed=0).double()
    with torch.no_grad():
        kernel.simplex_weights.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
    entered = []
    changed = _apply(kernel, torch.tensor([False, False, False]), torch.tensor([True, False, False]), {},
                     entered, ask=True)
    assert changed and entered == []
    assert kernel.simplex_weights.detach().ravel().tolist() == [0.0, 0.5, 0.5]
    assert kernel.simplex_mask.ravel().tolist() == [False, True, True]
    # With no round left only inputs already at 0 are held, and nothing else moves.
    kernel = ac.FSARDKernel(3, 8, ard_num_dims=3, simplex=True, seed=0).double()
    with torch.no_grad():
        kernel.simplex_weights.copy_(torch.tensor([[0.75, 0.25, 0.0]]))
    assert not _apply(kernel, torch.tensor([False, True, True]), torch.tensor([True, False, False]), {}, [],
                      ask=False)
    assert kernel.simplex_weights.detach().ravel().tolist() == [0.75, 0.25, 0.0]
    assert kernel.simplex_mask.ravel().tolist() == [True, True, False]
