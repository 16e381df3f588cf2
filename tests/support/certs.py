"""Certificates made by the tests: a private CA and leaf certificates it signs, written as
PEM files into a directory (``tmp_path``). The code lives in ``modelfleet.pki`` (which
``modelfleet up --secure`` uses too); this module keeps the tests' import path. No pytest here."""

from __future__ import annotations

from modelfleet.pki import LOOPBACK_SANS, CertAuthority, LeafFiles

__all__ = ["LOOPBACK_SANS", "CertAuthority", "LeafFiles"]
