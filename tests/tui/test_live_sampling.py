"""How the live view samples: off the UI thread, one sample at a time, paused, stale, failing."""

from __future__ import annotations

from gpubox.tui.status_bar import Line
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import FailingBackend, HangingBackend, settle, sim, wait_until

SIZE = (120, 40)


def pace(app: TopApp) -> str:
    return app.query_one("#pace", Line).plain


def status(app: TopApp) -> str:
    return app.query_one("#status", Line).plain


async def test_pause_stops_refreshing_and_resume_goes_on() -> None:
    app = TopApp(sim(), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)  # presses p
        assert "PAUSED" in pace(app)
        frozen = app.refreshes
        await pilot.pause(0.5)  # ten intervals
        assert app.refreshes == frozen
        await pilot.press("space")
        await wait_until(pilot, lambda: app.refreshes >= frozen + 2, "refreshes after resuming")
        assert "PAUSED" not in pace(app)


async def test_plus_and_minus_change_the_interval_within_bounds() -> None:
    app = TopApp(sim(), interval=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        assert app.poller.interval == 0.5
        assert "every 0.5 s" in pace(app)
        await pilot.press(*["plus"] * 6)
        assert app.poller.interval == 0.25
        await pilot.press(*["minus"] * 12)
        assert app.poller.interval == 10.0
        assert "every 10 s" in pace(app)


async def test_a_hung_sampler_shows_stale_and_the_view_recovers() -> None:
    backend = HangingBackend()
    app = TopApp(backend, interval=0.05, stale_after=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 2, "two refreshes")
        backend.hang = True
        await wait_until(pilot, lambda: "stale for" in pace(app), "the stale warning")
        stuck = app.refreshes
        calls = backend.calls
        await pilot.pause(0.3)  # the view stays live, and starts no more samples
        await pilot.press("r")  # nor when asked to
        assert backend.calls == calls and backend.running == 1
        assert app.refreshes == stuck
        backend.hang = False
        backend.release.set()
        await wait_until(pilot, lambda: app.refreshes >= stuck + 2, "refreshes after the sampler returned")
        await wait_until(pilot, lambda: "stale" not in pace(app), "the stale warning to go")
        assert backend.most_running == 1


async def test_samples_never_overlap_even_when_asked_for_often() -> None:
    backend = HangingBackend()
    app = TopApp(backend, interval=0.25)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(30):
            await pilot.press("r")
        await wait_until(pilot, lambda: app.refreshes >= 3, "three refreshes")
        assert backend.most_running == 1


async def test_a_failing_sample_is_reported_and_polling_goes_on() -> None:
    backend = FailingBackend(fail_on={3, 4})
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "sampling failed" in status(app), "the error message")
        assert "NVML_ERROR_UNKNOWN" in status(app)
        assert app.table.row_count == 6  # the last good figures stay
        await wait_until(pilot, lambda: backend.calls >= 6 and app.refreshes >= 4, "samples after the errors")
        await wait_until(pilot, lambda: "sampling failed" not in status(app), "the message to clear")
        assert app.is_running


async def test_a_bad_gpu_filter_ends_with_a_usage_error() -> None:
    app = TopApp(sim(2, 6), interval=0.05, gpu_filter="0,9")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.usage_error is not None, "the filter to be checked")
    assert app.return_code == 2
    assert app.usage_error == "no GPU 9 on this box (GPUs: 0, 1)"


async def test_a_gpu_filter_shows_only_those_gpus() -> None:
    app = TopApp(sim(4, 8), interval=0.05, gpu_filter="1,3")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        assert {p.gpu.label for p in app.query("GpuPanel").results() if p.gpu} == {"1", "3"}  # type: ignore[attr-defined]
        assert {str(c) for c in app.table.get_column("gpu")} == {"1", "3"}
