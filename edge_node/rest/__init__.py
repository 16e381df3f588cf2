"""The edge's HTTP API: OIP v2 REST over the inference data plane, metrics, health and status.

``app.create_app`` builds the ASGI app (a raw fast path for inference in front of FastAPI);
``routes`` are the ``/v2`` routes, ``infer`` the inference transport both run, ``codec`` the
OIP JSON/binary ⇄ :class:`~edge_node.inference.request.InferRequest` conversion and ``body``
the capped body readers.

Nothing is imported here: these modules import FastAPI, which an edge loads off its event
loop while its models load (see ``edge_node.server``); import the module you need."""

__all__: list[str] = []
