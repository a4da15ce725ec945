"""The box in the Prometheus exposition format: GPUs, GPU processes, queue depth and the ledger.

Imports prometheus_client but never a UI framework; `gpubox metrics` is its only caller.
"""
