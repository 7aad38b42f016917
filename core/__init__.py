"""core — the mathematics of cbo-agent.

Holds the incremental exact GP (a Cholesky factor kept current by row appends), kernels,
hyperparameter fitting, node models, the causal/function network and Monte-Carlo rollouts.

May import: torch, gpytorch, botorch, networkx, numpy (and pydantic/PyYAML for the experiment
spec). Never asyncio, MQTT, Prometheus, or any other room of this project.
"""
