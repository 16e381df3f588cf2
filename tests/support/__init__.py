"""Helpers the tests share: settings and factories for real centrals and edges (``fleet``),
polling (``wait``), Prometheus samples (``metrics``), sealed desired states (``seals``), the
virtual-time loop (``virtual_time``), brokers, certificates and models built by code. Fixtures
stay in the ``conftest.py`` files; everything a test imports by name comes from here."""
