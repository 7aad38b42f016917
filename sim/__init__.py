"""sim — simulators of the papers' environments, standing in for a real networked system.

Each environment is a plain object (see `sim.base.Environment`): `step(action) -> readings of
every node`, an oracle for E[y | action], its optimum and the paper's initial design. The device
runner puts any environment on MQTT as actuators and sensors.

May import: torch, numpy, scipy; the device runner also `connectors`. Never core, policies or
agent.
"""
