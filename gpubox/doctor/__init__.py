"""`gpubox doctor`: checks of the box and benchmarks of the paths data takes to the GPU, turned
into ranked findings with the fix for each. No UI imports here: the CLI renders the report."""
