"""Prometheus expositions read as a test reads them: every sample by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metric_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition: (name, labels) → value. Parsed with
    prometheus_client's own parser, so a malformed exposition fails the test."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0.0 when absent (a labelled counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
