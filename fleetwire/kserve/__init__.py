"""Stubs of the KServe / Open Inference Protocol v2 gRPC API (``inference.GRPCInferenceService``),
generated from proto/fleetwire/kserve by ``make proto``. Triton's gRPC client defines the same
message names in its own descriptor pool entry; the two cannot share one process."""
