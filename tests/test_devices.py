"""`cpu|cuda[:N]`: one reading for the service (CBO_DEVICE), the models and the benchmarks."""

from __future__ import annotations

import pytest
import torch

from agent.cli import main
from agent.config import ConfigError, load_config
from core.devices import available_devices, device_name, resolve_device
from core.errors import CoreError, DeviceError
from core.network import NetworkModel
from tests.test_policies_helpers import chain_spec

# A CUDA device no machine here has: refused whether CUDA is present or not.
ABSENT = "cuda:99"


def test_cpu_is_read_and_named():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert device_name("cpu") and "cpu" in available_devices()


@pytest.mark.parametrize(
    ("text", "says"),
    [("tpu", "expected cpu, cuda or cuda:N"), ("meta", "expected cpu"), (ABSENT, "CUDA")],
)
def test_anything_else_is_one_line_naming_it(text, says):
    with pytest.raises(DeviceError) as raised:
        resolve_device(text)
    message = str(raised.value)
    assert isinstance(raised.value, CoreError | ValueError)
    assert f"'{text}'" in message and says in message and "\n" not in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused_by_the_model_and_the_config():
    with pytest.raises(DeviceError, match="CUDA is not available"):
        NetworkModel(chain_spec(), device="cuda")
    with pytest.raises(ConfigError, match="device 'cuda'"):
        load_config(environ={"CBO_DEVICE": "cuda"})


def test_the_config_reads_cbo_device():
    assert load_config(environ={"CBO_DEVICE": "cpu"}).device == "cpu"
    with pytest.raises(ConfigError, match=ABSENT):
        load_config(environ={"CBO_DEVICE": ABSENT})


# `command`, not `benchmark`: pytest-benchmark (installed beside torch on the GPU machines)
# owns a fixture of that name and aborts the session on a parameter that shadows it.
@pytest.mark.parametrize("command", ["gp-update", "regret", "decision", "ingest", "fleet"])
def test_every_benchmark_refuses_an_absent_device_in_one_line(command, capsys):
    assert main(["bench", command, "--device", ABSENT]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cbo-agent bench {command}: error: --device:") and "\n" not in err
