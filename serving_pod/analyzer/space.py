"""The configuration space a sweep explores, and how one point of it becomes a ``ModelConfig``.

A :class:`ConfigPoint` is what Model Analyzer users tune: ``instance_group`` count, ``max_batch_size``,
dynamic batching on/off, ``max_queue_delay_microseconds`` and ``preferred_batch_size``. A
:class:`SearchSpace` holds the values each dimension may take plus the client concurrency levels.
:func:`apply_point` rewrites a model's on-disk config with a point (the result is sent to the server as
the repository load API's ``config`` override, and written as ``config.pbtxt`` for the winner).
Neighbours: ``search`` walks the space, ``profile`` reads the base configs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serving_pod.analyzer.errors import InputError

#: preferred batch size choices, relative to the point's max batch size
PREFERRED_CHOICES = ("none", "max", "half")
DIMENSIONS = ("instance_count", "dynamic_batching", "max_batch_size", "max_queue_delay_us", "preferred")


@dataclass(frozen=True, order=True)
class ConfigPoint:
    """One candidate configuration (normalized: no delay or preferred sizes without dynamic batching)."""

    instance_count: int
    max_batch_size: int
    dynamic_batching: bool
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()

    def normalized(self) -> ConfigPoint:
        if self.max_batch_size == 0 or not self.dynamic_batching:
            return replace(self, dynamic_batching=self.dynamic_batching and self.max_batch_size > 0,
                           max_queue_delay_us=0, preferred_batch_sizes=())
        sizes = tuple(sorted({s for s in self.preferred_batch_sizes if 0 < s <= self.max_batch_size}))
        return replace(self, preferred_batch_sizes=sizes)

    @property
    def key(self) -> str:
        """Stable identifier used in checkpoints and reports, e.g. ``i2-b32-db100-p16.32``."""
        batching = "nodb"
        if self.dynamic_batching:
            batching = f"db{self.max_queue_delay_us}"
            if self.preferred_batch_sizes:
                batching += "-p" + ".".join(str(s) for s in self.preferred_batch_sizes)
        return f"i{self.instance_count}-b{self.max_batch_size}-{batching}"

    @property
    def label(self) -> str:
        """Human form for tables and progress lines."""
        text = f"instances={self.instance_count} max_batch={self.max_batch_size}"
        if not self.dynamic_batching:
            return text + " dynamic_batching=off"
        text += f" delay={self.max_queue_delay_us}us"
        if self.preferred_batch_sizes:
            text += " preferred=" + ",".join(str(s) for s in self.preferred_batch_sizes)
        return text

    def preferred_choice(self) -> str:
        """Which of :data:`PREFERRED_CHOICES` the sizes are (``"custom"`` when none)."""
        for choice in PREFERRED_CHOICES:
            if preferred_sizes(choice, self.max_batch_size) == self.preferred_batch_sizes:
                return choice
        return "custom"

    def as_dict(self) -> dict[str, Any]:
        return {"instance_count": self.instance_count, "max_batch_size": self.max_batch_size,
                "dynamic_batching": self.dynamic_batching, "max_queue_delay_us": self.max_queue_delay_us,
                "preferred_batch_sizes": list(self.preferred_batch_sizes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfigPoint:
        return cls(int(data["instance_count"]), int(data["max_batch_size"]), bool(data["dynamic_batching"]),
                   int(data.get("max_queue_delay_us", 0)), tuple(int(s) for s in data.get("preferred_batch_sizes", ())))


def preferred_sizes(choice: str, max_batch_size: int) -> tuple[int, ...]:
    if choice == "none" or max_batch_size <= 0:
        return ()
    if choice == "max":
        return (max_batch_size,)
    if choice == "half":
        return tuple(sorted({max(1, max_batch_size // 2), max_batch_size}))
    raise InputError(f"unknown preferred batch size choice {choice!r} (use {', '.join(PREFERRED_CHOICES)})")


@dataclass(frozen=True)
class SearchSpace:
    """The values of every dimension, and the client concurrency levels (ascending)."""

    instance_counts: tuple[int, ...]
    max_batch_sizes: tuple[int, ...]
    dynamic_batching: tuple[bool, ...]
    delays_us: tuple[int, ...]
    preferred: tuple[str, ...]
    concurrencies: tuple[int, ...]

    def for_model(self, default: ConfigPoint) -> SearchSpace:
        """Restrict to what the model allows: a model without batching (max_batch_size 0) keeps 0 and no batcher."""
        if default.max_batch_size == 0:
            return replace(self, max_batch_sizes=(0,), dynamic_batching=(False,), delays_us=(0,), preferred=("none",))
        return self

    def values(self, dimension: str) -> tuple[Any, ...]:
        return {"instance_count": self.instance_counts, "dynamic_batching": self.dynamic_batching,
                "max_batch_size": self.max_batch_sizes, "max_queue_delay_us": self.delays_us,
                "preferred": self.preferred}[dimension]

    def grid(self) -> list[ConfigPoint]:
        """Every distinct normalized point (brute mode)."""
        points: dict[ConfigPoint, None] = {}
        for count, mbs, batching, delay, choice in itertools.product(
                self.instance_counts, self.max_batch_sizes, self.dynamic_batching, self.delays_us, self.preferred):
            points[ConfigPoint(count, mbs, batching, delay, preferred_sizes(choice, mbs)).normalized()] = None
        return list(points)


def with_value(point: ConfigPoint, dimension: str, value: Any) -> ConfigPoint:
    """``point`` with one dimension changed (preferred sizes follow a max batch size change)."""
    if dimension == "instance_count":
        return replace(point, instance_count=int(value)).normalized()
    if dimension == "dynamic_batching":
        return replace(point, dynamic_batching=bool(value)).normalized()
    if dimension == "max_batch_size":
        choice = point.preferred_choice()
        sizes = preferred_sizes(choice, int(value)) if choice != "custom" else point.preferred_batch_sizes
        return replace(point, max_batch_size=int(value), preferred_batch_sizes=sizes).normalized()
    if dimension == "max_queue_delay_us":
        return replace(point, max_queue_delay_us=int(value)).normalized()
    if dimension == "preferred":
        return replace(point, preferred_batch_sizes=preferred_sizes(str(value), point.max_batch_size)).normalized()
    raise ValueError(f"unknown dimension {dimension!r}")


def neighbours(space: SearchSpace, point: ConfigPoint, dimension: str) -> Iterator[ConfigPoint]:
    """Distinct points differing from ``point`` in ``dimension`` only (nothing when it has no effect)."""
    if dimension in ("max_queue_delay_us", "preferred") and not point.dynamic_batching:
        return
    seen = {point}
    for value in space.values(dimension):
        candidate = with_value(point, dimension, value)
        if dimension == "dynamic_batching" and value and not point.dynamic_batching:
            # switching the batcher on: start from the space's first delay and preferred choice
            candidate = with_value(with_value(candidate, "max_queue_delay_us", space.delays_us[0]),
                                   "preferred", space.preferred[0])
        if candidate not in seen:
            seen.add(candidate)
            yield candidate


# ---------------------------------------------------------------------------------------------- configs


def read_base_config(model_dir: Path, name: str) -> Any:
    """The model's ``config.pbtxt`` as Triton's ``ModelConfig``; problems become :class:`InputError`."""
    from serving_pod.core.errors import ServerError
    from serving_pod.repository.config import load_config

    try:
        return load_config(model_dir, name)
    except ServerError as exc:
        raise InputError(str(exc)) from None


def point_of(config: Any) -> ConfigPoint:
    """The point a config sits at (its instance groups' total count, batching settings)."""
    count = sum(group.count or 1 for group in config.instance_group) or 1
    batching = config.HasField("dynamic_batching")
    delay = config.dynamic_batching.max_queue_delay_microseconds if batching else 0
    sizes = tuple(config.dynamic_batching.preferred_batch_size) if batching else ()
    return ConfigPoint(count, config.max_batch_size, batching, delay, sizes).normalized()


def apply_point(base: Any, point: ConfigPoint) -> Any:
    """A copy of ``base`` set to ``point``; other fields (I/O, backend, parameters, queue policy) are kept."""
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig()
    config.CopyFrom(base)
    groups = list(config.instance_group)
    kind = groups[0].kind if groups else mc.ModelInstanceGroup.Kind.KIND_CPU
    gpus = list(groups[0].gpus) if groups else []
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count, group.kind = point.instance_count, kind
    group.gpus.extend(gpus)
    config.max_batch_size = point.max_batch_size
    if point.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = point.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(point.preferred_batch_sizes)
    else:
        config.ClearField("dynamic_batching")
    return config


def config_json(config: Any) -> str:
    """The config as the repository load API's ``config`` parameter (JSON, proto field names)."""
    from google.protobuf import json_format

    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def config_dict(config: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def config_from_dict(data: dict[str, Any]) -> Any:
    """A ``ModelConfig`` from its JSON form (a checkpoint's, or a server's ``/config``; unknown fields skipped)."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    return json_format.ParseDict(data, mc.ModelConfig(), ignore_unknown_fields=True)


def config_pbtxt(config: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


# ---------------------------------------------------------------------------------------------- parsing


def parse_int_list(text: str, what: str, *, minimum: int) -> tuple[int, ...]:
    """``"1,2,4"`` or ``"1..32"`` (powers of two from the start, the end included), ascending and distinct."""
    text = text.strip()
    if ".." in text:
        low_s, _, high_s = text.partition("..")
        low, high = _int(low_s, what, minimum), _int(high_s, what, minimum)
        if low > high:
            raise InputError(f"invalid {what} range {text!r}: start {low} is above end {high}")
        levels, level = [], low
        while level < high:
            levels.append(level)
            level = max(level * 2, level + 1)
        return tuple(sorted({*levels, high}))
    values = [_int(part, what, minimum) for part in text.split(",") if part.strip()]
    if not values:
        raise InputError(f"{what} list is empty")
    return tuple(sorted(set(values)))


def _int(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InputError(f"invalid {what} {text.strip()!r}: not an integer") from None
    if value < minimum:
        raise InputError(f"invalid {what} {value}: must be >= {minimum}")
    return value


def parse_choices(text: str, what: str, allowed: Sequence[str]) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise InputError(f"invalid {what} {text!r}: use a comma-separated list of {', '.join(allowed)}")
    return values
