"""Replicated central (issue 13): leadership, partition ownership and the fleet state replicas share."""
