"""Run schemathesis over a live server's OpenAPI document with a bounded number of
examples per operation, collecting every failure instead of stopping at the first.

The servers under test run on the test's event loop; schemathesis is synchronous
(requests), so ``fuzz_api`` is meant to run in a worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

#: No 5xx; status, content type and body all as the OpenAPI document declares them.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class FuzzReport:
    """What a run saw: failures per operation and the statuses answered per operation."""

    failures: dict[str, list[str]] = field(default_factory=dict)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    operations: list[str] = field(default_factory=list)


def _pinned(strategy: st.SearchStrategy[Case], pins: dict[str, str]) -> st.SearchStrategy[Case]:
    """Half the cases address what exists (the pushed model and version), so that the code
    past the lookups gets fuzzed too."""

    def pin(case: Case) -> Case:
        params = case.path_parameters or {}
        case.path_parameters = {**params, **{k: v for k, v in pins.items() if k in params}}
        return case

    return st.one_of(strategy, strategy.map(pin))


def _fuzz_operation(
    operation: APIOperation, base_url: str, pins: dict[str, str], max_examples: int, report: FuzzReport
) -> None:
    label = operation.label
    report.operations.append(label)
    seen = report.statuses.setdefault(label, Counter())
    strategy = operation.as_strategy()
    if operation.method.upper() != "DELETE":  # a pinned DELETE would remove what the run relies on
        strategy = _pinned(strategy, pins)

    @given(case=strategy)
    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(case: Case) -> None:
        try:
            response = case.call(base_url=base_url)
            seen[response.status_code] += 1
            case.validate_response(response, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis reports an exception group
            report.failures.setdefault(label, []).append(str(exc)[:800])

    run()


def fuzz_api(base_url: str, *, exclude: str, pins: dict[str, str], max_examples: int) -> FuzzReport:
    """Fuzz every operation of ``base_url``'s schema whose path does not match ``exclude``;
    ``pins`` are path parameter values that exist (half the cases use them)."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json").exclude(path_regex=exclude)
    report = FuzzReport()
    for result in schema.get_all_operations():
        _fuzz_operation(result.ok(), base_url, pins, max_examples, report)
    return report
