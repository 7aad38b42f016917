"""MCBO's input-dependent hallucination η_i(z) for noisy networks, R restarts in one tensor.

Each node i gets a two-layer ReLU network (paper 004 A.3; width 4·in as the authors' code):

    η_i(z) = 2·sigmoid(W2ᵀ relu(W1ᵀ z + b1) + b2) − 1 ∈ (−1, 1),

z the node's GP inputs scaled to the unit cube (a constant 0 input for a node without inputs, so
its η is a learned constant). b2 plays the authors' `fc_baseline`: it starts at
logit(U[0.001, 0.999]), so the initial η are spread over (−1, 1). All R restarts are one batch:
weights carry a leading restart dimension and every forward pass is one `einsum`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> torch.Tensor:
    return (2.0 * torch.rand(shape, generator=generator, dtype=torch.float64) - 1.0) * bound


class EtaNets:
    """Per-node η networks for R restarts.

    Args:
        widths: node -> input width (≥ 1).
        restarts: R.
        hidden_factor: hidden width = hidden_factor · input width.
        generator: initial weights.
    """

    def __init__(
        self,
        widths: Mapping[str, int],
        restarts: int,
        hidden_factor: int,
        generator: torch.Generator,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.restarts = restarts
        self.params: dict[str, dict[str, torch.Tensor]] = {}
        for node, width in widths.items():
            hidden = hidden_factor * width
            u = 0.001 + 0.998 * torch.rand(restarts, generator=generator, dtype=torch.float64)
            raw = {
                "w1": _uniform((restarts, width, hidden), 1 / math.sqrt(width), generator),
                "b1": _uniform((restarts, hidden), 1 / math.sqrt(width), generator),
                "w2": _uniform((restarts, hidden), 1 / math.sqrt(hidden), generator),
                "b2": torch.logit(u),
            }
            self.params[node] = {
                k: v.to(dtype=dtype, device=device).requires_grad_(True) for k, v in raw.items()
            }

    def parameters(self) -> list[torch.Tensor]:
        return [p for node in self.params.values() for p in node.values()]

    def eta(self, node: str, z: torch.Tensor) -> torch.Tensor:
        """(S, R, w) unit-cube inputs -> (S, R) η in (−1, 1)."""
        p = self.params[node]
        hidden = torch.relu(torch.einsum("srw,rwh->srh", z, p["w1"]) + p["b1"])
        out = torch.einsum("srh,rh->sr", hidden, p["w2"]) + p["b2"]
        return 2.0 * torch.sigmoid(out) - 1.0

    def export(self, r: int) -> dict[str, dict[str, torch.Tensor]]:
        """Restart r's weights (detached copies), to warm-start a later round."""
        return {
            node: {k: v[r].detach().clone() for k, v in p.items()}
            for node, p in self.params.items()
        }

    @torch.no_grad()
    def start_constant(self, first: int, eta: torch.Tensor, nodes: list[str]) -> None:
        """Restarts first.. start near constant η: (k, len(nodes)) values in (−1, 1).

        b2 = logit((η + 1)/2) and the output weights shrink ×0.1, so the net starts close to
        the constant-η solution (a network with W2 = 0 is exactly one) and learns from there.
        """
        rows = slice(first, first + eta.shape[0])
        for e, node in enumerate(nodes):
            p = self.params[node]
            share = ((eta[:, e] + 1) / 2).clamp(0.001, 0.999).to(p["b2"])
            p["b2"][rows] = torch.logit(share)
            p["w2"][rows] *= 0.1

    @torch.no_grad()
    def load(self, r: int, state: Mapping[str, Mapping[str, torch.Tensor]]) -> bool:
        """Put saved weights into restart r; False (nothing loaded) if the shapes differ."""
        if set(state) != set(self.params) or any(
            state[node][k].shape != v.shape[1:]
            for node, p in self.params.items()
            for k, v in p.items()
        ):
            return False
        for node, p in self.params.items():
            for k, v in p.items():
                v[r] = state[node][k].to(v)
        return True
