"""Where a custom loop's in-graph fetch takes its timestamps (input_wait._replica_cpus, decided
before the fetch, and _one_part_a_device, of the batch it fetched): on the last replica's device
only for parts fetched to this host's CPUs; the host's CPU:0 on anything else (the second
timestamp and the wait, where only the batch's parts do not match), never the probe turned off
for an unexpected strategy or device."""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.tf


def _iterator(devices, options=None):
    extended = types.SimpleNamespace(worker_devices=devices)
    return types.SimpleNamespace(_strategy=types.SimpleNamespace(extended=extended), _options=options)


def _placed(it, batch):
    from tpuwatch.agent.input_wait import _one_part_a_device, _replica_cpus

    return _one_part_a_device(_replica_cpus(it), batch)


def _batch(parts: int):
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    return (values_lib.PerReplica(tuple(tf.constant([1.0]) for _ in range(parts))),)


def test_parts_on_this_hosts_cpus_are_timed_on_the_last_ones_device():
    devices = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3))
    # each with whether it is the host's CPU:0, whose part waits for what the host adds of the wait
    assert _placed(_iterator(devices), _batch(3)) == tuple(zip(devices, (True, False, False)))


@pytest.mark.parametrize("devices, parts, options", [
    (tuple(f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(2)), 2, None),  # no timestamp op there
    (("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"), 2, None),
    (("/job:localhost/replica:0/task:0/device:CPU:0",), 1, None),  # one device: the host's already
    (("/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"), 3, None),
    # InputOptions(experimental_fetch_to_device=False): the parts stay on the host
    (("/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"), 2,
     types.SimpleNamespace(experimental_fetch_to_device=False)),
    (("not a device string",), 1, None),
])
def test_anything_else_keeps_the_hosts_timestamp(devices, parts, options):
    assert _placed(_iterator(devices, options), _batch(parts)) is None


def test_a_strategy_that_cannot_say_its_devices_keeps_the_hosts_timestamp():
    """The base strategy's ``worker_devices`` raises (NotImplementedError, RuntimeError): the
    placement falls back, where it turned the input-wait probe off for the run."""
    class Extended:
        @property
        def worker_devices(self):
            raise NotImplementedError("worker_devices not supported")

    it = types.SimpleNamespace(_strategy=types.SimpleNamespace(extended=Extended()), _options=None)
    assert _placed(it, _batch(2)) is None


def test_a_private_module_that_moved_keeps_the_hosts_timestamp(monkeypatch):
    """TensorFlow's private ``framework.device`` gone (another version): the placement falls back
    to the host's timestamp instead of raising into the probe, which would turn it off."""
    import sys

    from tensorflow.python import framework

    monkeypatch.delattr(framework, "device", raising=False)
    monkeypatch.setitem(sys.modules, "tensorflow.python.framework.device", None)  # its import fails
    devices = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2))
    assert _placed(_iterator(devices), _batch(2)) is None
