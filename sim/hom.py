"""Paper 000's role-based higher-order policy (HOM, Alg. 1–3 and Eq. 3) for n cooperating agents.

θ is one flat vector; the policy reads it through four sub-networks:

- role affinity Λ_i(s) = w_i · s + b_i, one linear map per role i (`role_i` blocks). The roles
  are assigned by the Hungarian algorithm, α = argmax_α Σ_i Λ_i(s^{α(i)})
  (`scipy.optimize.linear_sum_assignment`), so agent α(i) takes role i (Alg. 1, Eq. 2).
- edge affinity Λ_v(s^{α(i)}, s^{α(ℓ)}), an MLP on the two role states: role i listens to role
  ℓ ≠ i when it is > 0 (Alg. 2; directed, no self edges — the paper leaves both open).
- message M(h_i, h_ℓ, i, ℓ), an MLP on both hidden states and the one-hot role indices.
- update U(s^{α(i)}, h_i, m_i), an MLP whose tanh output is the next hidden state.

Inference is Eq. 3 for `ROUNDS` rounds from h_0 = 0:

    m_i ← Σ_{ℓ ∈ N(i)} M(h_i, h_ℓ, i, ℓ),   h_i ← U(s^{α(i)}, h_i, m_i),

and the action of agent α(i) is h_i after the last round (the hidden size is the action size),
in (−1, 1); the caller maps it onto its environment's action range. The permutation is undone
at the end (Alg. 3), so permuting the agents permutes their actions.

Each MLP is input → `HIDDEN` tanh units → output ("three layers, four neurons" in the paper:
input, hidden and output layer, our reading); θ holds each network unit by unit — each hidden
unit's weights and bias, then each output's — so the spec's blocks are the networks' units.
τ = `ROUNDS`, h_0, the role-index encoding and the output squashing are ours (the paper gives
none of them).

The ablations (paper 000, Fig. 3/6; their semantics are our reading of the names):
- −RA (`role_assignment=False`): α is the identity, agent i always takes role i; θ has no role
  blocks.
- −RI (`role_interaction=False`): no interaction graph and no messages, h_i ← U(s^{α(i)}, h_i);
  θ has no edge or message blocks and U no message input.

`soft=True` is the differentiable relaxation the paper uses for its surrogate Hessian only:
Sinkhorn–Knopp's doubly stochastic matrix for the assignment and sigmoid edges, both at
temperature `TEMPERATURE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

__all__ = ["HIDDEN", "ROUNDS", "HOMController", "unit_blocks"]

HIDDEN = 4
ROUNDS = 2
TEMPERATURE = 1.0  # lower approaches the hard policy, but saturates: the Hessian vanishes
SINKHORN_ITERATIONS = 30


def _mlp_size(inputs: int, outputs: int) -> int:
    return HIDDEN * (inputs + 1) + outputs * (HIDDEN + 1)


def unit_blocks(
    inputs: int, hidden: int, outputs: int, start: int, prefixes: tuple[str, str]
) -> dict[str, tuple[int, int]]:
    """The units of a one-hidden-layer MLP laid out unit by unit from `start` — each hidden
    unit's weights and bias (`{prefixes[0]}{j}`), then each output's (`{prefixes[1]}{k}`) —
    as half-open ranges of θ."""
    blocks = {}
    for j in range(hidden):
        blocks[f"{prefixes[0]}{j}"] = (start, start + inputs + 1)
        start += inputs + 1
    for k in range(outputs):
        blocks[f"{prefixes[1]}{k}"] = (start, start + hidden + 1)
        start += hidden + 1
    return blocks


def _mlp(params: torch.Tensor, x: torch.Tensor, inputs: int, outputs: int) -> torch.Tensor:
    """x (..., inputs) → (..., outputs) through one tanh hidden layer; linear output."""
    split = HIDDEN * (inputs + 1)
    first = params[:split].reshape(HIDDEN, inputs + 1)
    second = params[split:].reshape(outputs, HIDDEN + 1)
    hidden = torch.tanh(x @ first[:, :inputs].T + first[:, inputs])
    return hidden @ second[:, :HIDDEN].T + second[:, HIDDEN]


def _sinkhorn(logits: torch.Tensor) -> torch.Tensor:
    """A doubly stochastic matrix from (n, n) logits, by alternate row and column normalization."""
    log_p = logits
    for _ in range(SINKHORN_ITERATIONS):
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
    return log_p.exp()


@dataclass(frozen=True)
class HOMController:
    """The HOM policy of `agents` agents with `obs`-dim states and `act`-dim actions.

    `dim` is the length of θ, `blocks` its named units as half-open ranges (in θ's order).
    """

    agents: int
    obs: int
    act: int
    role_assignment: bool = True
    role_interaction: bool = True

    @property
    def _update_inputs(self) -> int:
        return self.obs + self.act * (2 if self.role_interaction else 1)

    @cached_property
    def _networks(self) -> dict[str, tuple[int, int, int]]:
        """Network name → (start in θ, inputs, outputs), in θ's order."""
        shapes = []
        if self.role_assignment:
            shapes.append(("role", self.agents * (self.obs + 1), 0, 0))
        if self.role_interaction:
            shapes.append(("edge", _mlp_size(2 * self.obs, 1), 2 * self.obs, 1))
            message_inputs = 2 * self.act + 2 * self.agents
            shapes.append(
                ("message", _mlp_size(message_inputs, self.act), message_inputs, self.act)
            )
        shapes.append(
            ("update", _mlp_size(self._update_inputs, self.act), self._update_inputs, self.act)
        )
        out, start = {}, 0
        for name, size, inputs, outputs in shapes:
            out[name] = (start, inputs, outputs)
            start += size
        out["end"] = (start, 0, 0)
        return out

    @property
    def dim(self) -> int:
        return self._networks["end"][0]

    @cached_property
    def blocks(self) -> dict[str, tuple[int, int]]:
        blocks: dict[str, tuple[int, int]] = {}
        for name, (start, inputs, outputs) in self._networks.items():
            if name == "role":
                for i in range(self.agents):
                    offset = start + i * (self.obs + 1)
                    blocks[f"role_{i}"] = (offset, offset + self.obs + 1)
            elif name != "end":
                blocks.update(
                    unit_blocks(inputs, HIDDEN, outputs, start, (f"{name}_h", f"{name}_o"))
                )
        return blocks

    def _params(self, theta: torch.Tensor, name: str) -> torch.Tensor:
        names = list(self._networks)
        start = self._networks[name][0]
        stop = self._networks[names[names.index(name) + 1]][0]
        return theta[start:stop]

    def assignment(self, theta: torch.Tensor, states: torch.Tensor, soft: bool) -> torch.Tensor:
        """P (roles, agents): P[i, ℓ] = 1 iff agent ℓ takes role i (soft: doubly stochastic)."""
        n = self.agents
        if not self.role_assignment:
            return torch.eye(n, dtype=states.dtype)
        weights = self._params(theta, "role").reshape(n, self.obs + 1)
        affinity = weights[:, : self.obs] @ states.T + weights[:, self.obs, None]  # [role, agent]
        if soft:
            return _sinkhorn(affinity / TEMPERATURE)
        _, agents = linear_sum_assignment(affinity.detach().cpu().numpy(), maximize=True)
        return torch.eye(n, dtype=states.dtype)[torch.as_tensor(agents)]

    def actions(
        self, theta: torch.Tensor, states: torch.Tensor, soft: bool = False
    ) -> torch.Tensor:
        """Actions (agents, act) in (−1, 1) for the agents' states (agents, obs), agent order.

        Args:
            theta: (dim,) the policy's parameters.
            states: (agents, obs) each agent's observation.
            soft: the differentiable relaxation (Sinkhorn assignment, sigmoid edges).
        """
        P = self.assignment(theta, states, soft)
        roled = P @ states  # role i's state in row i
        edges = self.interaction(theta, roled, soft) if self.role_interaction else None
        h = torch.zeros(self.agents, self.act, dtype=states.dtype)
        for _ in range(ROUNDS):  # Eq. 3
            inputs = [roled, h]
            if edges is not None:
                inputs.append((edges[..., None] * self._messages(theta, h)).sum(1))
            update = _mlp(
                self._params(theta, "update"), torch.cat(inputs, -1), self._update_inputs, self.act
            )
            h = torch.tanh(update)
        return P.T @ h  # back to agent order

    def interaction(self, theta: torch.Tensor, roled: torch.Tensor, soft: bool) -> torch.Tensor:
        """E (roles, roles): E[i, ℓ] = 1 iff role i listens to role ℓ ≠ i (soft: sigmoid)."""
        n = self.agents
        pairs = torch.cat([roled[:, None].expand(n, n, -1), roled[None, :].expand(n, n, -1)], -1)
        logits = _mlp(self._params(theta, "edge"), pairs, 2 * self.obs, 1)[..., 0]
        edges = torch.sigmoid(logits / TEMPERATURE) if soft else (logits > 0).to(roled.dtype)
        return edges * (1 - torch.eye(n, dtype=roled.dtype))  # no self edges

    def _messages(self, theta: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """M(h_i, h_ℓ, i, ℓ) for every pair of roles: (roles, roles, act)."""
        n, act = self.agents, self.act
        roles = torch.eye(n, dtype=h.dtype)
        inputs = torch.cat(
            [
                h[:, None].expand(n, n, act),
                h[None, :].expand(n, n, act),
                roles[:, None].expand(n, n, n),
                roles[None, :].expand(n, n, n),
            ],
            -1,
        )
        return _mlp(self._params(theta, "message"), inputs, inputs.shape[-1], act)

    def numpy_actions(self, theta: np.ndarray, states: np.ndarray) -> np.ndarray:
        """`actions` on numpy arrays (float64), the hard policy the devices run."""
        with torch.no_grad():
            out = self.actions(
                torch.as_tensor(theta, dtype=torch.float64),
                torch.as_tensor(states, dtype=torch.float64),
            )
        return out.numpy()
