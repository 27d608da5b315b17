"""The DMS service's Prometheus metrics, in a registry of the service's own.

Every series is named ``dms_...`` (the process collector's are the standard ``process_...``):

- ``dms_frames_in_total``, ``dms_frames_published_total{valid}``,
  ``dms_frames_dropped_total{stage}``: frames received, published (valid or invalid) and dropped
  (by where: a replaced frame's stage, ``shutdown``);
- ``dms_invalid_frames_total{kind}``: frames published invalid, by their reason's kind (the
  summary's counts);
- ``dms_stage_seconds{stage}``: time per frame in each of the :data:`STAGES` — ``camera`` (from the
  frame's start of frame to its arrival in the service), ``warp``, ``model``, ``decode`` and
  ``publish`` (building the message and handing it to every sink);
- ``dms_frame_age_seconds``: start of frame to publication;
- ``dms_timeouts_total{layer}``: timeouts by layer;
- ``dms_availability{state}`` (1 for the current state) and
  ``dms_availability_transitions_total{to}``: changes of availability, by the state changed to
  (a new reason within the same state is no transition);
- ``dms_accelerator_restarts_total``: sessions of the accelerator that failed while running and
  were torn down to be opened again;
- ``dms_sink_dropped_total{sink}``: messages each sink dropped (its statistics' ``dropped``);
- ``dms_build_info{version,model}``: 1, labelled with the package's version and the model's
  checkpoint (its file name where it names none; empty until a model is loaded);
- ``process_...``: the process collector's CPU time, memory, open files, start time.

The counters that prometheus_client keeps a ``_created`` series for show none: the registry
(:class:`ServiceRegistry`) leaves those samples out of what its collectors give, in either
exposition format. No prometheus_client setting of the process is changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from aio_runtime import Availability

from ... import __version__
from ..sinks.base import SinkStats

if TYPE_CHECKING:
    from ..model.contract import ModelContract

__all__ = ["STAGES", "DeviceFacts", "Metrics", "ServiceRegistry"]

STAGES = ("camera", "warp", "model", "decode", "publish")
"""The stages a frame's time is measured in, in order."""

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
_CREATED_TYPES = ("counter", "histogram", "summary")


class DeviceFacts(Protocol):
    """What the metrics read of the model's device at each scrape."""

    @property
    def restarts(self) -> int:
        """Sessions that failed while running and were torn down to be opened again."""

    @property
    def contract(self) -> ModelContract | None:
        """The loaded model's contract (None until it is loaded)."""


class _WithoutCreated:
    """A collector as it is, less its metrics' ``_created`` samples."""

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def describe(self) -> Iterable[Metric]:
        describe: Callable[[], Iterable[Metric]] | None = getattr(self._collector, "describe", None)
        return describe() if describe is not None else []

    def collect(self) -> Iterator[Metric]:
        for metric in self._collector.collect():
            if metric.type in _CREATED_TYPES:
                created = f"{metric.name}_created"
                metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


class ServiceRegistry(CollectorRegistry):
    """A registry whose collectors show no ``_created`` samples: each is registered wrapped in a
    filter, so every way of reading the registry (all of it, or only some names) goes through
    it."""

    def __init__(self) -> None:
        super().__init__()
        self._wrapped: dict[Collector, _WithoutCreated] = {}

    def register(self, collector: Collector) -> None:
        wrapped = _WithoutCreated(collector)
        super().register(wrapped)
        self._wrapped[collector] = wrapped

    def unregister(self, collector: Collector) -> None:
        super().unregister(self._wrapped.pop(collector))


class _Facts:
    """The series read where they are kept, at each scrape: the accelerator's restarts, the
    sinks' drops, the build."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families(read=False)

    def collect(self) -> Iterable[Metric]:
        return self._families(read=True)

    def _families(self, *, read: bool) -> list[Metric]:
        metrics = self._metrics
        restarts = CounterMetricFamily(
            "dms_accelerator_restarts",
            "Accelerator sessions that failed while running and were torn down to be reopened",
            value=metrics.restarts() if read else 0,
        )
        dropped = CounterMetricFamily(
            "dms_sink_dropped", "Messages each sink dropped", labels=["sink"]
        )
        build = InfoMetricFamily("dms_build", "The package's version and the model's checkpoint")
        if read:
            for stats in metrics.sink_stats():
                dropped.add_metric([stats.name], stats.dropped)
            build.add_metric([], {"version": metrics.version, "model": metrics.model_name()})
        return [restarts, dropped, build]


class Metrics:
    """The service's Prometheus metrics, in a registry of their own (:attr:`registry`).

    The frame counters and histograms are updated as frames end; the accelerator's restarts, the
    sinks' drops and the model's name are read where they are kept, at each scrape, once
    :meth:`read_from` has said where."""

    def __init__(self, *, version: str | None = None) -> None:
        self.version = __version__ if version is None else version
        self.registry = ServiceRegistry()
        r = self.registry
        self.frames_in = Counter("dms_frames_in", "Camera frames received", registry=r)
        self.frames_published = Counter(
            "dms_frames_published", "Frames published", ["valid"], registry=r
        )
        self.frames_dropped = Counter(
            "dms_frames_dropped",
            "Frames dropped, by where: replaced by a newer frame (latest frame wins), not started "
            "(overload), skipped by a recorded source that fell behind (camera), stopped "
            "(shutdown)",
            ["stage"],
            registry=r,
        )
        self.frames_late = Counter(
            "dms_frames_late", "Frames published valid after their deadline", registry=r
        )
        self.invalid_frames = Counter(
            "dms_invalid_frames",
            "Frames published invalid, by the kind of their reason",
            ["kind"],
            registry=r,
        )
        self.stage_latency = Histogram(
            "dms_stage_seconds",
            "Time per frame in each stage",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end = Histogram(
            "dms_frame_age_seconds",
            "Start of frame to publication",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.timeouts = Counter("dms_timeouts", "Timeouts by layer", ["layer"], registry=r)
        self.availability = Gauge(
            "dms_availability", "1 for the current availability state", ["state"], registry=r
        )
        self.transitions = Counter(
            "dms_availability_transitions",
            "Changes of availability, by the state changed to",
            ["to"],
            registry=r,
        )
        for stage in STAGES:  # each shows from the start, at zero
            self.stage_latency.labels(stage=stage)
        for state in Availability:
            self.transitions.labels(to=state.value)
        ProcessCollector(registry=r)
        r.register(_Facts(self))
        self._sinks: Callable[[], Iterable[SinkStats]] = list
        self._device: DeviceFacts | None = None

    def read_from(
        self,
        *,
        sinks: Callable[[], Iterable[SinkStats]] | None = None,
        device: DeviceFacts | None = None,
    ) -> None:
        """Where the series kept elsewhere are read at each scrape: ``sinks()``, every sink's
        statistics; ``device``, the model's device (its restarts, its model)."""
        if sinks is not None:
            self._sinks = sinks
        if device is not None:
            self._device = device

    def sink_stats(self) -> Iterable[SinkStats]:
        return self._sinks()

    def restarts(self) -> int:
        return 0 if self._device is None else self._device.restarts

    @property
    def model(self) -> ModelContract | None:
        """The loaded model's contract (None until it is loaded, or with no device to read)."""
        return None if self._device is None else self._device.contract

    def model_name(self) -> str:
        """The loaded model's checkpoint, else its file's name (empty until it is loaded)."""
        contract = self.model
        if contract is None:
            return ""
        if contract.model_checkpoint:
            return contract.model_checkpoint
        return "" if contract.path is None else contract.path.name

    def set_availability(self, availability: Availability) -> None:
        for state in Availability:
            self.availability.labels(state=state.value).set(1.0 if state == availability else 0.0)

    def transition(self, to: Availability) -> None:
        """The availability changed to ``to``."""
        self.transitions.labels(to=Availability(to).value).inc()
