"""Bad inputs to the incremental GP raise errors that say what is wrong."""

from __future__ import annotations

import math

import pytest
import torch

from core.gp import GPConfig, IncrementalGP
from core.gp.checks import check_observations


@pytest.fixture
def model() -> IncrementalGP:
    return IncrementalGP(torch.tensor([[[0.0, 1.0]] * 2] * 3, dtype=torch.float64))


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        (torch.zeros(3), r"shape \(b, d, 2\)"),
        (torch.tensor([[1.0, 0.0]]), "upper bound must exceed"),
        (torch.tensor([[0.0, math.inf]]), "finite"),
    ],
)
def test_bad_bounds(bounds, message):
    with pytest.raises(ValueError, match=message):
        IncrementalGP(bounds)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kernel": "cosine"}, "kernel must be one of"),
        ({"refit_every": 0}, "refit_every"),
        ({"window": 0}, "window"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPConfig(**kwargs)


def test_bad_noise():
    with pytest.raises(ValueError, match=r"noise_variance\[1\]"):
        IncrementalGP(torch.tensor([[[0.0, 1.0]]] * 2), GPConfig(noise_variance=[0.1, -1.0]))
    with pytest.raises(ValueError, match="needs 2 entries"):
        IncrementalGP(torch.tensor([[[0.0, 1.0]]] * 2), GPConfig(noise_variance=[0.1]))


def test_wrong_shapes(model):
    with pytest.raises(ValueError, match=r"x must have shape \(3, 2\)"):
        model.learn_one(torch.zeros(3, 3), torch.zeros(3))
    with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
        model.learn_one(torch.zeros(3, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        model.learn_one(torch.zeros(3, 2), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match=r"x must have shape \(3, q, 2\)"):
        model.posterior(torch.zeros(2, 4, 2))
    with pytest.raises(ValueError, match=r"\(batch, m, dim\)"):
        model.learn_many(torch.zeros(3, 2), torch.zeros(3))


def test_nan_and_inf_are_rejected_where_they_matter(model):
    with pytest.raises(ValueError, match=r"y holds NaN or infinity at index \[1\]"):
        model.learn_one(torch.zeros(3, 2), torch.tensor([0.0, math.nan, 0.0]))
    with pytest.raises(ValueError, match=r"x holds NaN or infinity at index \[2\]"):
        model.learn_one(torch.tensor([[0.0, 0], [0, 0], [math.inf, 0]]), torch.zeros(3))
    with pytest.raises(ValueError, match="query points hold NaN"):
        model.posterior(torch.full((3, 1, 2), math.nan))
    # a member that observed nothing may carry a placeholder NaN
    observed = torch.tensor([True, False, True])
    model.learn_one(torch.zeros(3, 2), torch.tensor([0.0, math.nan, 1.0]), observed)
    assert model.num_observations.tolist() == [1, 0, 1]


def test_finite_values_whose_sum_overflows_are_accepted():
    """The finiteness check sums the values first; an overflow of finite ones is no error."""
    zeros, huge = torch.zeros(3, dtype=torch.float64), torch.full((3,), 1e308, dtype=torch.float64)
    cpu = torch.device("cpu")
    check_observations(zeros[:, None].expand(3, 2), huge, (3,), None, 2, cpu)
    check_observations(huge[:, None].expand(3, 2), zeros, (3,), None, 2, cpu)
    huge[2] = math.inf
    with pytest.raises(ValueError, match=r"y holds NaN or infinity at index \[2\]"):
        check_observations(zeros[:, None].expand(3, 2), huge, (3,), None, 2, cpu)


def test_bad_hyperparameters(model):
    with pytest.raises(ValueError, match="lengthscale must be finite and positive"):
        model.set_hyperparameters(lengthscale=torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"outputscale must have shape \(3,\)"):
        model.set_hyperparameters(outputscale=torch.ones(4))


def test_unknown_pending_handle_and_member(model):
    with pytest.raises(KeyError, match="no pending point with handle 7"):
        model.drop_pending(7)
    with pytest.raises(IndexError, match="out of range"):
        model.posterior(torch.zeros(1, 2), members=5)
    with pytest.raises(ValueError, match="dims must hold 3 integers"):
        IncrementalGP(torch.tensor([[[0.0, 1.0]] * 2] * 3), dims=[1, 2, 3])


def test_a_collapsed_lengthscale_fit_is_floored_and_the_factor_stays_valid(monkeypatch):
    """A fit that sends one lengthscale to ~0 (seen: 2.5e-12 for GP-UCB on alpine2-noisy)
    would make the squared distances cancel into an indefinite Gram matrix: it is floored."""
    import core.gp.refit as refit_module
    from core.gp import LENGTHSCALE_FLOOR
    from core.hyperfit import FittedHyperparameters

    def collapsed(z, y, **_):
        lengthscale = torch.full((z.shape[-1],), 0.3, dtype=z.dtype)
        lengthscale[0] = 2.5e-12
        return FittedHyperparameters(lengthscale, 13.0, 1e-3, True)

    monkeypatch.setattr(refit_module, "fit_hyperparameters", collapsed)
    gen = torch.Generator().manual_seed(3)
    bounds = torch.tensor([[0.0, 10.0]] * 6, dtype=torch.float64)
    model = IncrementalGP(bounds, GPConfig(noise_variance=None, refit_every=10, misfit_z=None))
    for i in range(60):
        x = 10 * torch.rand(1, 6, generator=gen, dtype=torch.float64)
        x[0, 0] = 10.0 * (i % 2)  # the collapsed dimension sits on its bounds, as GP-UCB's does
        model.learn_one(x, 100 * x[:, 1].sin() * x[:, 2].sqrt())
    assert model.lengthscale.min() >= LENGTHSCALE_FLOOR
    post = model.posterior(10 * torch.rand(1, 7, 6, generator=gen, dtype=torch.float64))
    assert torch.isfinite(post.mean).all() and (post.variance > 0).all()
