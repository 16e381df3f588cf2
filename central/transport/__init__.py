"""Thin transports over ``central.core.Central``: REST (FastAPI) and gRPC."""
