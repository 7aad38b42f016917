"""policies — decision rules over core: MCBO, EI-FN, D-GP-UCB, GP-UCB, random, …

Each policy is one file with one interface, `propose(model, constraints, rng) -> Proposal`;
constraint handling (cardinality, budget) lives here. May import: core (and torch, botorch).
Never asyncio, MQTT, or the agent.
"""
