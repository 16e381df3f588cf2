"""Stores kept as plain files users handle themselves: the JSON token files."""
