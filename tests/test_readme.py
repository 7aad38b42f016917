"""The README matches the code: its Python examples run as written, its configuration table lists
every setting, variable and flag of `cbo-agent run`, and the demo's policies it lists work."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from pydantic import BaseModel

from agent.cli import RUN_FLAG_SETTINGS, RUN_SPEC_FLAGS, build_parser
from agent.config import _ENVIRONMENT, AgentConfig
from agent.demo import DemoOptions, array_environments, decomposed_environments, demo_spec
from agent.validate import check_policy
from policies.registry import policy_names
from sim.registry import environment_names, make_environment

README = Path(__file__).resolve().parents[1] / "README.md"
CONFIG_HEADER = "| setting | variable | flag |"


def test_python_examples_in_readme_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


# ---- the configuration table ------------------------------------------------------------------


def config_table() -> list[tuple[str | None, list[str], list[str]]]:
    """(setting key or None, variables, flags) of each row of the README's configuration table."""
    lines = README.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(CONFIG_HEADER)]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        key, variables, flags = (re.findall(r"`([^`]+)`", cell) for cell in line.split("|")[1:4])
        assert len(key) <= 1, f"one setting per row: {line}"
        rows.append((key[0] if key else None, variables, flags))
    return rows


def config_keys(model: type[BaseModel] = AgentConfig, prefix: str = "") -> set[str]:
    """Every leaf setting of the configuration file, dotted: broker.url, metrics.port, ..."""
    keys = set()
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            keys |= config_keys(kind, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def run_options() -> dict[str, str]:
    """Option string -> dest of every flag `cbo-agent run` accepts (global ones included)."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = {}
    for action in [*parser._actions, *commands.choices["run"]._actions]:
        for option in action.option_strings:
            if option not in ("-h", "--help"):
                options[option] = action.dest
    return options


def test_readme_configuration_table_lists_every_setting_variable_and_flag():
    rows = config_table()
    keys = [key for key, _, _ in rows if key is not None]
    assert sorted(keys) == sorted(config_keys()), "README table vs agent/config.py settings"
    variables = [v for _, row_variables, _ in rows for v in row_variables]
    assert sorted(variables) == sorted(_ENVIRONMENT), "README table vs agent/config.py variables"
    options = {flag: dest for flag, dest in run_options().items() if dest not in RUN_SPEC_FLAGS}
    flags = [f for _, _, row_flags in rows for f in row_flags]
    assert sorted(flags) == sorted(options), "README table vs `cbo-agent run` flags"
    for key, row_variables, row_flags in rows:
        for variable in row_variables:
            assert ".".join(_ENVIRONMENT[variable]) == key, f"{variable} sets {key}?"
        for flag in row_flags:
            if key is None:
                assert flag == "--config", f"{flag} sets no setting in the table"
                continue
            dest = options[flag]
            assert dest in RUN_FLAG_SETTINGS, f"{flag} is not passed to the configuration"
            assert ".".join(RUN_FLAG_SETTINGS[dest]) == key, f"{flag} sets {key}?"


def test_every_run_flag_reaches_the_configuration():
    dests = set(run_options().values()) - {"config", *RUN_SPEC_FLAGS}
    assert dests == set(RUN_FLAG_SETTINGS)
    for path in RUN_FLAG_SETTINGS.values():
        assert ".".join(path) in config_keys()


# ---- the demo's policies ----------------------------------------------------------------------


def demo_paragraph() -> str:
    text = README.read_text()
    return text.split("**The demo**", 1)[1].split("\n\n", 1)[0].replace("\n", " ")


def test_readme_lists_the_demo_policies_that_work():
    paragraph = demo_paragraph()
    anywhere = re.search(r"`--policy ([a-z|]+)` \(any environment\)", paragraph)
    decomposed = re.search(r"`--policy (\w+)` only with `--env ([a-z|-]+)`", paragraph)
    assert anywhere and decomposed, paragraph
    general = anywhere.group(1).split("|")
    fidelity = re.search(r"`--policy ([a-z|]+)` only with `--env ([a-z0-9|]+)` \(paper", paragraph)
    assert fidelity, paragraph
    multi = fidelity.group(1).split("|")
    vector = re.search(
        r"`--policy ([a-z|]+)` only with `--env ([a-z0-9|-]+)` \(paper 000", paragraph
    )
    assert vector, paragraph
    vector_policies = vector.group(1).split("|")
    hard = re.search(r"`--policy (\w+)` \(hard interventions only: `--env ([a-z|]+)`", paragraph)
    assert hard, paragraph
    scalar_only = re.search(r"`--policy ([a-z|]+)` \(any environment but `([a-z|-]+)`", paragraph)
    composite = re.search(
        r"`--policy ([a-z|]+)` only with `--env\s+([a-z|-]+)` \(paper 002", paragraph
    )
    assert scalar_only and composite, paragraph
    assert scalar_only.group(2).split("|") == array_environments() == composite.group(2).split("|")
    scalar = scalar_only.group(1).split("|")
    composites = composite.group(1).split("|")
    named = [*general, *scalar, *composites, *multi, *vector_policies]
    assert sorted([*named, decomposed.group(1), hard.group(1)]) == sorted(policy_names())
    hard_envs = hard.group(2).split("|")
    assert sorted(hard_envs) == sorted(
        env for env in environment_names() if make_environment(env, 0).intervention_type == "hard"
    )
    for env in hard_envs:
        assert check_policy(demo_spec(DemoOptions(env=env, policy=hard.group(1)))) == []
    for env in vector.group(2).split("|"):
        spec = demo_spec(DemoOptions(env=env))
        for policy in vector_policies:
            candidate = spec.model_copy(
                update={"policy": spec.policy.model_copy(update={"name": policy, "settings": {}})}
            )
            assert check_policy(candidate) == [], (env, policy)
    for env in fidelity.group(2).split("|"):
        spec = demo_spec(DemoOptions(env=env))
        for policy in multi:
            candidate = spec.model_copy(
                update={"policy": spec.policy.model_copy(update={"name": policy, "settings": {}})}
            )
            assert check_policy(candidate) == [], (env, policy)
    for env in array_environments():
        for policy in [*general, *composites]:
            candidate = demo_spec(DemoOptions(env=env, policy=policy))
            assert check_policy(candidate) == [], (env, policy)
        for policy in scalar:
            assert check_policy(demo_spec(DemoOptions(env=env, policy=policy))), (env, policy)
    for env in environment_names():
        spec = demo_spec(DemoOptions(env=env))
        usable = general if env in array_environments() else [*general, *scalar]
        for policy in usable:
            candidate = spec.model_copy(
                update={"policy": spec.policy.model_copy(update={"name": policy, "settings": {}})}
            )
            assert check_policy(candidate) == [], (env, policy)
    assert sorted(decomposed.group(2).split("|")) == sorted(decomposed_environments())
    for env in decomposed.group(2).split("|"):
        assert check_policy(demo_spec(DemoOptions(env=env, policy=decomposed.group(1)))) == []


def test_readme_shows_the_flags_that_change_the_specs():
    """`run`'s spec flags are not settings: README's "Trying policies" shows each."""
    text = README.read_text()
    section = text.split("**Trying policies**", 1)[1].split("\n\n", 1)[0]
    options = run_options()
    for dest in RUN_SPEC_FLAGS:
        (flag,) = [f for f, d in options.items() if d == dest]
        assert f"`{flag} " in section, flag
