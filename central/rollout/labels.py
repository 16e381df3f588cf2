"""Label selectors: which nodes a rollout or a maintenance window applies to."""

from __future__ import annotations


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Label equality match; an empty selector matches every node."""
    return all(labels.get(k) == v for k, v in selector.items())


def describe_selector(selector: dict[str, str]) -> str:
    """``zone=b,tier=gpu``, or ``(every node)``."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "(every node)"
