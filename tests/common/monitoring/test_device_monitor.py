"""Tests axlearn/common/monitoring/device_monitor.py and its use by the trainer's watchdog."""

import threading
import time

import pytest
from absl import logging

from axlearn.common import trainer_watchdog
from axlearn.common.config import config_class
from axlearn.common.monitoring.device_monitor import DeviceMonitor, DeviceMonitorClient
from axlearn.common.utils import DeviceUsage


class ScriptedClient(DeviceMonitorClient):
    """Returns the readings in `readings` in turn (the last one repeats)."""

    @config_class
    class Config(DeviceMonitorClient.Config):
        """Configures ScriptedClient."""

        # The readings returned by successive checks; the last one repeats.
        readings: list = []
        # If set, every reading raises this message.
        fail_with: str = ""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.calls = 0

    def collect_metrics(self) -> list[DeviceUsage]:
        cfg = self.config
        if cfg.fail_with:
            raise RuntimeError(cfg.fail_with)
        reading = cfg.readings[min(self.calls, len(cfg.readings) - 1)]
        self.calls += 1
        return reading

    def is_host_idle(self, usages: list[DeviceUsage]) -> bool:
        return all(u.device_utilization <= 0.1 for u in usages)


def _usage(utilization: float) -> list[DeviceUsage]:
    return [DeviceUsage(device_id=i, device_utilization=utilization) for i in range(2)]


def _monitor(readings=(), **kwargs) -> DeviceMonitor:
    client = ScriptedClient.default_config().set(readings=list(readings), **kwargs)
    cfg = DeviceMonitor.default_config().set(
        monitor_client=client, check_interval_in_sec=0.02, log_every_n=1
    )
    return cfg.instantiate()


def _wait_for(predicate, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_busy_then_idle_then_busy():
    monitor = _monitor([_usage(0.9)] * 3 + [_usage(0.0)] * 3 + [_usage(0.5)])
    seen = []
    with monitor.start_monitoring():
        assert _wait_for(lambda: seen.append(monitor.is_host_idle()) or monitor._client.calls >= 7)
    # Never idle before the idle readings, idle while they last, busy again after.
    assert seen[0] is False and True in seen and monitor.is_host_idle() is False
    first_idle = seen.index(True)
    assert all(v is False for v in seen[:first_idle])


def test_one_idle_device_of_two_is_not_an_idle_host():
    readings = [
        [
            DeviceUsage(device_id=0, device_utilization=0.0),
            DeviceUsage(device_id=1, device_utilization=0.8),
        ]
    ]
    monitor = _monitor(readings)
    with monitor.start_monitoring():
        assert _wait_for(lambda: monitor._client.calls >= 3)
    assert monitor.is_host_idle() is False


def test_disabled_monitor_starts_no_thread():
    cfg = DeviceMonitor.default_config().set(check_interval_in_sec=0)
    monitor = cfg.instantiate()
    before = {t.name for t in threading.enumerate()}
    with monitor.start_monitoring():
        assert "device_monitor" not in {t.name for t in threading.enumerate()} - before
    assert monitor.is_host_idle() is False


def test_thread_stops_with_the_block():
    monitor = _monitor([_usage(0.5)])
    with monitor.start_monitoring():
        assert any(t.name == "device_monitor" for t in threading.enumerate())
    assert not any(t.name == "device_monitor" for t in threading.enumerate())


def test_a_failing_reading_is_not_idle_and_does_not_stop_the_monitor(caplog):
    monitor = _monitor([_usage(0.0)], fail_with="device query failed")
    with caplog.at_level(logging.WARNING):
        with monitor.start_monitoring():
            time.sleep(0.1)
    assert monitor.is_host_idle() is False
    assert "device query failed" in caplog.text


def test_base_client_reports_nothing_and_refuses_readings():
    client = DeviceMonitorClient.default_config().instantiate()
    assert client.collect_metrics() == []
    assert client.is_host_idle([]) is False
    with pytest.raises(ValueError, match="cannot judge device readings"):
        client.is_host_idle(_usage(0.0))


@pytest.mark.parametrize(
    "field,value,match",
    [("check_interval_in_sec", -1.0, "must be >= 0"), ("log_every_n", 0, "must be >= 1")],
)
def test_bad_fields(field, value, match):
    with pytest.raises(ValueError, match=match):
        DeviceMonitor.default_config().set(**{field: value}).instantiate()


def test_watchdog_logs_a_stall_on_idle_devices_at_once(monkeypatch):
    """The step stalls and the devices are idle: logged within a few checks, long before the
    watchdog's own timeout (60 s); no exit."""
    logged = []
    done = threading.Event()

    def fake_warning(msg, *args):
        logged.append(msg % args)
        done.set()

    monkeypatch.setattr(trainer_watchdog.logging, "warning", fake_warning)
    exited = []
    monkeypatch.setattr(trainer_watchdog.os, "_exit", exited.append)
    watchdog = trainer_watchdog.Watchdog(
        current_step=lambda: 3,
        timeout_seconds=60,
        crash_timeout_seconds=None,
        name="test.watchdog",
        device_monitor=_monitor([_usage(0.0)]),
    )
    start = time.monotonic()
    with watchdog.running():
        assert done.wait(5.0)
    assert time.monotonic() - start < 5.0 and exited == []
    assert len(logged) == 1 and "host's devices are idle" in logged[0]
    assert "Thread stacks" in logged[0]


def test_watchdog_does_not_log_a_stall_on_busy_devices(monkeypatch):
    logged = []
    monkeypatch.setattr(trainer_watchdog.logging, "warning", lambda msg, *a: logged.append(msg))
    watchdog = trainer_watchdog.Watchdog(
        current_step=lambda: 3,
        timeout_seconds=60,
        crash_timeout_seconds=None,
        name="test.watchdog",
        device_monitor=_monitor([_usage(0.9)]),
    )
    with watchdog.running():
        time.sleep(0.3)
    assert logged == []


def test_watchdog_does_not_log_advancing_steps_on_idle_devices(monkeypatch):
    logged = []
    monkeypatch.setattr(trainer_watchdog.logging, "warning", lambda msg, *a: logged.append(msg))
    steps = iter(range(10**6))
    watchdog = trainer_watchdog.Watchdog(
        current_step=lambda: next(steps),
        timeout_seconds=None,
        crash_timeout_seconds=None,
        name="test.watchdog",
        device_monitor=_monitor([_usage(0.0)]),
    )
    with watchdog.running():
        time.sleep(0.3)
    assert logged == []


def test_trainer_runs_the_monitor_and_logs_a_stall_on_idle_devices(tmp_path, caplog):
    """`SpmdTrainer.Config.device_monitor`: the monitor runs during `run()`; a 2 s checkpoint
    stall while the (scripted) devices are idle is logged without `watchdog_timeout_seconds`."""
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=7)
    cfg.device_monitor = DeviceMonitor.default_config().set(
        monitor_client=ScriptedClient.default_config().set(readings=[_usage(0.0)]),
        check_interval_in_sec=0.1,
    )
    cfg.checkpointer = tu.SleepyCheckpointer.default_config().set(sleep_seconds=2.0)
    cfg.checkpointer.save_policy.n = 6
    trainer = cfg.instantiate(parent=None)
    with caplog.at_level("WARNING"):
        import jax  # pylint: disable=import-outside-toplevel

        trainer.run(jax.random.PRNGKey(0))
    assert trainer.step == 7
    messages = [r.getMessage() for r in caplog.records]
    assert any("has not advanced" in m and "host's devices are idle" in m for m in messages)
    assert not any(t.name == "device_monitor" for t in threading.enumerate())
