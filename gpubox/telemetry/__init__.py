"""Telemetry: what every GPU and GPU process on the box is doing. No UI imports here."""
