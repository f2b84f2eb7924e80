"""Device monitor: samples the devices' usage on a thread and tells whether the host is idle.

`SpmdTrainer.Config.device_monitor` takes a `DeviceMonitor` config. While the trainer runs, the
monitor asks its client for every local device's `DeviceUsage` each `check_interval_in_sec`
seconds, logs the sample every `log_every_n` checks and keeps the client's verdict on whether the
host is idle. The trainer's watchdog reads that verdict: a step that stalls while the devices are
idle is a hang (logged with every thread's stack at once, without waiting for
`watchdog_timeout_seconds`).

The base `DeviceMonitorClient` reports no usage and never calls the host idle; a platform's client
(one of the user's: AXLearn's NVML-based GPU client is not built here) subclasses it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Literal, Optional

from absl import logging

from axlearn.common.config import Configurable, config_class, maybe_instantiate
from axlearn.common.utils import DeviceUsage as Usage


class DeviceMonitorClient(Configurable):
    """Reads the usage of this host's devices. The base client has no readings."""

    @config_class
    class Config(Configurable.Config):
        """Configures DeviceMonitorClient."""

        # The platform whose devices the client reads (named in the monitor's log lines).
        platform: Literal["tpu", "gpu", "trainium"] = "tpu"

    def collect_metrics(self) -> list[Usage]:
        """Returns one usage per local device (none for the base client).

        Returns:
            The devices' usage readings.
        """
        return []

    def is_host_idle(self, usages: list[Usage]) -> bool:
        """Whether the readings say the host's devices are idle (never, for the base client).

        Args:
            usages: What `collect_metrics` returned.

        Returns:
            True if every device is idle.

        Raises:
            ValueError: If the base client is given readings (it cannot judge them).
        """
        if usages:
            raise ValueError(
                f"{type(self).__name__} cannot judge device readings; use a platform's client."
            )
        return False


class DeviceMonitor(Configurable):
    """Samples the devices' usage on a background thread and keeps whether the host is idle.

    Interface: `start_monitoring()` (a context manager: the thread runs inside it) and
    `is_host_idle()` (the verdict of the last check; False before the first).
    """

    @config_class
    class Config(Configurable.Config):
        """Configures DeviceMonitor."""

        # The client that reads the devices.
        monitor_client: DeviceMonitorClient.Config = DeviceMonitorClient.default_config()
        # Seconds between checks; 0 disables the monitor (no thread, never idle).
        check_interval_in_sec: float = 60
        # Log the readings every this many checks.
        log_every_n: int = 10

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self.config
        if cfg.check_interval_in_sec < 0:
            raise ValueError(
                f"DeviceMonitor.check_interval_in_sec={cfg.check_interval_in_sec} must be >= 0 "
                "(0 disables the monitor)."
            )
        if cfg.log_every_n < 1:
            raise ValueError(f"DeviceMonitor.log_every_n={cfg.log_every_n} must be >= 1.")
        self._client: DeviceMonitorClient = maybe_instantiate(cfg.monitor_client)
        self._idle = False
        self._checks = 0
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None

    @contextlib.contextmanager
    def start_monitoring(self) -> Iterator[None]:
        """Runs the monitor's thread for the duration of the block (none if disabled)."""
        if self.config.check_interval_in_sec > 0:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, name="device_monitor", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            if self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = None

    def is_host_idle(self) -> bool:
        """Returns the verdict of the last check: whether the host's devices are idle."""
        return self._idle

    def _check(self) -> bool:
        """Reads the devices once, logs every `log_every_n`-th reading; returns whether idle."""
        cfg = self.config
        usages = self._client.collect_metrics()
        if self._checks % cfg.log_every_n == 0:
            logging.info("%s device usage: %s", cfg.monitor_client.platform, usages)
        self._checks += 1
        return self._client.is_host_idle(usages)

    def _loop(self) -> None:
        while True:
            try:
                self._idle = self._check()
            except Exception as e:  # pylint: disable=broad-except
                # A failing reading never stops training; the host is not called idle.
                logging.warning("Device monitor: reading the devices failed: %s", e)
                self._idle = False
            if self._stop.wait(self.config.check_interval_in_sec):
                return
