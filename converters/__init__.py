"""Converters from other frameworks to edgeflow (host only: the device never imports them)."""
