"""The edge's HTTP API (status now; the Open Inference Protocol joins it later)."""
