"""The GPU ledger: where the GPU hours went.

`accounting` turns two consecutive telemetry samples of a GPU into the increments to record,
`rollup` gathers them per minute and per hour, `store` keeps them in `ledger.db` under the state
directory, and `recorder` is what the queue daemon holds. `report` adds them up over a window by
gpu, job, kind, tag or user (reading through `queries`, with `findings`), and `series` gives the
utilisation over time per GPU for a chart.
"""
