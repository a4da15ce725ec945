"""The live view of `gpubox top`, in Textual. The telemetry core never imports this package."""
