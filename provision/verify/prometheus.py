"""Read a server's /metrics: the Prometheus text exposition format, parsed by prometheus_client.

A foreign document is bounded before it is parsed: every line, every label value and the number of
samples have a ceiling, so a hostile or broken endpoint costs a clear error, never unbounded memory
or time. Lines look like `vllm:generation_tokens_total{engine="0",model_name="tiny"} 42.0`; `#` lines
are HELP/TYPE comments; label values may hold escaped quotes, backslashes and newlines.
"""

from __future__ import annotations

from dataclasses import dataclass

# vllm:cache_config_info carries every cache setting as a label (about 40). A vLLM line is under 300 bytes (the longest: a histogram bucket with model_name, engine and le); a
# served model name is at most a path. Ten times that is still a metrics line, anything longer is not.
MAX_LINE_BYTES = 4096
MAX_LABEL_VALUE_BYTES = 1024
MAX_LABELS = 128
# vLLM 0.32 on one engine writes about 600 samples; a data-parallel server multiplies that per engine.
MAX_SAMPLES = 100_000


class MetricsFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _bounded_lines(text: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE_BYTES:
            raise MetricsFormatError(f"line {number} is longer than {MAX_LINE_BYTES} bytes")


def parse(text: str) -> list[Sample]:
    """Every sample of `text`, in order; MetricsFormatError when it is not the text format or is
    past a bound."""
    from prometheus_client.parser import text_string_to_metric_families

    _bounded_lines(text)
    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if len(sample.labels) > MAX_LABELS:
                    raise MetricsFormatError(f"{sample.name} has more than {MAX_LABELS} labels")
                for key, value in sample.labels.items():
                    if len(value) > MAX_LABEL_VALUE_BYTES:
                        raise MetricsFormatError(
                            f"{sample.name}: label {key} is longer than {MAX_LABEL_VALUE_BYTES} bytes"
                        )
                out.append(Sample(sample.name, dict(sample.labels), float(sample.value)))
                if len(out) > MAX_SAMPLES:
                    raise MetricsFormatError(f"more than {MAX_SAMPLES} samples")
    except MetricsFormatError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        # prometheus_client says what it could not read (a value that is not a number, a bad label set)
        raise MetricsFormatError(f"not the Prometheus text format: {exc}") from None
    return out


def matching(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples of `name` whose labels include `labels`."""
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def counter_sum(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of every sample of `name` whose labels include `labels`; None when there is none."""
    values = [s.value for s in matching(samples, name, **labels)]
    return sum(values) if values else None
