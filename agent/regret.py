"""Regret as the agent reports it.

With a simulator, oracle messages carry E[y | a_t] and the optimum, so regret is true:
    cumulative R_T = Σ_t (f*_t − E[y_t | a_t]),   simple r_T = min_t (f*_t − E[y_t | a_t]).
For a stationary system (`reward.optimum: fixed`, the default) f*_t = f* is one number, so
r_T = f* − max_t E[y | a_t]; for a system that drifts (`reward.optimum: per_round`) f*_t is the
optimum of round t, stated by that round's oracle message, and R_T is the dynamic regret.
On a real system neither is known; the agent then exports a model-based estimate under its own
name, `cbo_regret_model_estimate`: the running sum over rounds of max(0, UCB(best candidate) −
LCB(chosen action)) of E[reward | do(a)], computed from the experiment's own model (the node GPs,
through the graph, by Monte-Carlo rollouts) at the time of the decision, at a bounded cost
(`regret_bound`). It is not a bound: a finite candidate set may miss the UCB's maximum, and the
model may be miscalibrated. (It was called an "upper estimate" and came from a second,
graph-blind GP with its own refits; both are gone.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from core.network import FieldDraws, NetworkModel, NodeQuery
from core.spec import ExperimentSpec


class RegretTracker:
    """Rewards, oracle values and regret of one experiment.

    `optimum` is the optimum last accepted; `optima` every round's (round -> f*_t). With one
    optimum per experiment (`reward.optimum: fixed`) every round's regret is taken against
    `optimum`, as the checks keep it one number (`agent.join.oracle_problem`); per round
    (`per_round`), against the round's own.
    """

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self.per_round = spec.reward.optimum == "per_round"
        self.expected: dict[int, float] = {}
        self.optima: dict[int, float] = {}
        self.optimum: float | None = None
        self.last_reward: float | None = None
        self.last_reward_round: int | None = None
        self.best_reward: float = -math.inf
        self.upper_estimate: float | None = None

    @property
    def has_oracle(self) -> bool:
        return self.optimum is not None and bool(self.expected)

    @property
    def cumulative(self) -> float | None:
        if not self.has_oracle:
            return None
        if not self.per_round:
            return sum(self.optimum - value for value in self.expected.values())
        return sum(self.optima[t] - value for t, value in self.expected.items())

    @property
    def simple(self) -> float | None:
        if not self.has_oracle:
            return None
        if not self.per_round:
            return self.optimum - max(self.expected.values())
        # the best round's regret: with one optimum, f* − max_t E[y | a_t] again
        return min(self.optima[t] - value for t, value in self.expected.items())

    def observe_reward(self, round_number: int, reward: float) -> None:
        self.last_reward = reward
        self.last_reward_round = round_number
        self.best_reward = max(self.best_reward, reward)

    def observe_oracle(self, round_number: int, expected: float, optimum: float) -> bool:
        """Record a simulator's oracle values; False for a round already recorded."""
        if round_number in self.expected:
            return False
        self.expected[round_number] = expected
        self.optima[round_number] = optimum
        self.optimum = optimum
        return True

    def add_upper_increment(self, ucb_best: float, lcb_chosen: float) -> None:
        """One round's model-based regret term, UCB at the best candidate − LCB at the choice
        (`upper_estimate` keeps its old name; the metric is `cbo_regret_model_estimate`)."""
        self.upper_estimate = (self.upper_estimate or 0.0) + max(ucb_best - lcb_chosen, 0.0)


REGRET_BETA = 2.0  # σ-multiplier of the bound (≈ 95% two-sided for a Gaussian posterior)
CANDIDATES = 64  # interventions compared per round: the chosen one, past ones, uniform draws
SAMPLES = 16  # Monte-Carlo rollouts per candidate
_PAST = 16  # the most recent past interventions among the candidates


def regret_bound(
    model: NetworkModel, intervention: Mapping[str, float], rng: torch.Generator
) -> tuple[float, float] | None:
    """(UCB of the best candidate, LCB of `intervention`) of E[reward | do(a)], from the
    experiment's own model: the node GPs, through the causal graph.

    For each candidate a, SAMPLES Monte-Carlo rollouts draw every node's value from its
    posterior (mean + std·ε) at its sampled parents; the reward's mean μ(a) and spread σ(a)
    over the rollouts give UCB = μ + βσ and LCB = μ − βσ, β = REGRET_BETA. Candidates: the
    chosen intervention, the last _PAST ones run, and uniform draws over the allowed target
    sets (or the spec's finite candidates), CANDIDATES in all. Cost: CANDIDATES × SAMPLES
    posterior evaluations per node, O(n²) each — bounded whatever the experiment's length;
    no other model is kept. None until the reward has two observations.

    Array nodes (a reward of fields, or a field feeding scalar nodes; issue 15): each field
    takes SAMPLES Matheron sample paths of its model *as fitted now* (rollout s passes path s
    on, as the policies' rollouts do), O(n³ + t³) once per call (the Kronecker eigen-solve,
    `core.gp.matheron`). A field is never fitted here — seconds this estimate must not spend:
    while a field with readings has no fitted model yet (the service fits it beside the loop,
    `NetworkModel.prepare_fields`) the round has no estimate (None), and the running sum
    leaves that round out. The spread over the rollouts is then the fields' epistemic
    uncertainty (sample paths of the latent field, not its observation noise) with the scalar
    nodes' posterior draws.

    Under a calibrated model UCB − LCB bounds the round's regret only if the candidates reach
    the UCB's maximum over the whole domain; a finite candidate set may fall short of it, so
    the sum is a model-based estimate, not a bound.
    """
    if not _enough_rewards(model):
        return None
    fields = None
    if model.array_shapes:
        fields = model.fitted_field_draws(SAMPLES, rng)
        if fields is None:  # a field's first fit is not in yet: no estimate this round
            return None
    chosen = dict(intervention)
    past = [r.intervention for r in model.history[-_PAST - 1 : -1]]
    candidates = [chosen, *past]
    candidates += _draws(model, rng, max(CANDIDATES - len(candidates), 0))
    mean, std = _reward_moments(model, candidates[:CANDIDATES], rng, fields)
    ucb_best = float((mean + REGRET_BETA * std).max())
    lcb_chosen = float(mean[0] - REGRET_BETA * std[0])
    return ucb_best, lcb_chosen


def _enough_rewards(model: NetworkModel) -> bool:
    """Whether the reward has two observations: its node GP's rows, its components' (a
    decomposed reward), or the rounds with a reward (a reward of fields has no GP of its own,
    and a network of array nodes only has none at all)."""
    reward = model.reward_node
    if model.field_reward is not None or not model.order:
        return len(model.observed_rewards) >= 2
    counts = model.gp.num_observations.tolist()
    learners = [model.member[reward]] if reward in model.member else list(model.member.values())
    return min(counts[j] for j in learners) >= 2


@torch.no_grad()
def _reward_moments(
    model: NetworkModel,
    candidates: list[Mapping[str, float]],
    rng: torch.Generator,
    fields: FieldDraws | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(K,) mean and std of the reward over SAMPLES rollouts of each candidate intervention.

    Candidates are grouped by the actions they set (a hard intervention fixes its nodes), one
    batched rollout per group: (SAMPLES, k) draws of every node. `fields`: SAMPLES sample
    paths of each array node (soft interventions only: an array node is fed by soft actions,
    so there is one group)."""
    hard = model.spec.intervention == "hard"
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, candidate in enumerate(candidates):
        key = tuple(sorted(candidate)) if hard else ()
        groups.setdefault(key, []).append(i)
    mean = torch.empty(len(candidates), dtype=model.dtype)
    std = torch.empty(len(candidates), dtype=model.dtype)

    def sample(query: NodeQuery) -> torch.Tensor:
        shape = torch.broadcast_shapes((SAMPLES, 1), query.mean.shape)
        noise = torch.randn(shape, generator=rng, dtype=query.mean.dtype)
        return query.mean + query.std * noise.to(query.mean)

    if len(groups) > 1:
        actions = torch.stack([model.action_vector(c) for c in candidates])
        draws = _mixed_rollout(model, actions, candidates, sample)
        draws = draws.expand(SAMPLES, len(candidates))
        return draws.mean(0).cpu(), draws.std(0).cpu()
    for set_actions, members in groups.items():
        actions = torch.stack([model.action_vector(candidates[i]) for i in members])
        if fields is not None:  # (1, k, A): the paths' S leads, as in the policies' rollouts
            actions = actions.unsqueeze(0)
        values = model.rollout(actions, sample, set_actions=set_actions, fields=fields)
        draws = values[model.reward_node].expand(SAMPLES, len(members))
        index = torch.tensor(members)
        mean[index] = draws.mean(0).cpu()
        std[index] = draws.std(0).cpu()
    return mean, std


def _mixed_rollout(
    model: NetworkModel,
    actions: torch.Tensor,
    candidates: list[Mapping[str, float]],
    sample: Callable[[NodeQuery], torch.Tensor],
) -> torch.Tensor:
    """The reward's (SAMPLES, K) draws for hard interventions of different target sets, in one
    pass through the network: each node's posterior is evaluated once for all K candidates,
    and a node a candidate intervenes on takes that action's value in its column.

    The same draws as one `NetworkModel.rollout` per target set (`set_actions`), with one
    posterior evaluation per node instead of one per node and target set, each at the rows
    the per-set rollouts would ask (a node is not asked where a candidate sets it): at these
    sizes much of a posterior's cost is fixed (tens of torch calls)."""
    names = model.action_names
    setting: dict[str, tuple[int, torch.Tensor]] = {}  # node -> (action column, (K,) set mask)
    for name in names:
        mask = torch.tensor([name in c for c in candidates], device=actions.device)
        if bool(mask.any()):
            setting[model.spec.action(name).targets[0]] = (names.index(name), mask)
    values: dict[str, torch.Tensor] = {}
    for node in model.order:
        column = setting.get(node)
        if column is not None and bool(column[1].all()):
            values[node] = actions[..., column[0]]  # every candidate sets it: no GP needed
            continue
        inputs = model.node_inputs_at(node, actions, values)
        if column is None:
            mean, std = model.node_posterior(node, inputs)
            values[node] = sample(NodeQuery(node, inputs, mean, std, model.noise_std(node)))
            continue
        # asked only where no candidate sets it (as many rows as the per-set rollouts ask)
        free = (~column[1]).nonzero().squeeze(-1)
        asked = inputs.index_select(-2, free)
        mean, std = model.node_posterior(node, asked)
        drawn = sample(NodeQuery(node, asked, mean, std, model.noise_std(node)))
        full = actions[..., column[0]].expand((*drawn.shape[:-1], len(candidates))).clone()
        full[..., free] = drawn
        values[node] = full
    if model.reward_function is not None:
        values[model.reward_node] = model.compose(values, actions)
    return values[model.reward_node]


def _draws(model: NetworkModel, rng: torch.Generator, count: int) -> list[dict[str, float]]:
    """`count` interventions: the spec's finite candidates, else uniform over each allowed
    target set's box (soft interventions: every action, uniform over its bounds)."""
    spec = model.spec
    names = model.action_names
    if spec.candidates is not None:
        rows = spec.candidates
        picks = torch.randint(len(rows), (count,), generator=rng).tolist()
        return [dict(zip(names, rows[i], strict=True)) for i in picks]
    bounds = model.action_bounds().cpu()
    sets = spec.allowed_target_sets() if spec.intervention == "hard" else [tuple(names)]
    draws = torch.rand(count, len(names), generator=rng, dtype=bounds.dtype)
    values = bounds[:, 0] + draws * (bounds[:, 1] - bounds[:, 0])
    out = []
    for i in range(count):
        chosen = sets[i % len(sets)]
        out.append({name: float(values[i, names.index(name)]) for name in chosen})
    return out
