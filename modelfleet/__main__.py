"""``python -m modelfleet`` is the ``modelfleet`` command."""

from modelfleet.cli import main

raise SystemExit(main())
