"""connectors — the outside world of cbo-agent.

Holds the MQTT topic layout (`topics`), the message schemas and their JSON codec (`schemas`),
the reconnecting MQTT client (`mqtt`) and the Prometheus exporter with health endpoints
(`metrics`).

May import: the standard library, pydantic, aiomqtt, paho-mqtt, prometheus_client and structlog.
Never torch, gpytorch, botorch, nor the core, policies, agent or sim rooms: the arrows point into
this room (agent → connectors, sim → connectors), never out of it.
"""
