"""--since and --until far outside any real window are one line and exit 2, never a traceback."""

from __future__ import annotations

import pytest

from tests.helpers import run_gpubox


@pytest.mark.parametrize("when", ["99999999999999999999d", "9999999999999d", "100000d", "1969-12-31T00:00+00:00"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_window_outside_1970_to_9999_is_a_usage_error(when: str, as_json: bool) -> None:
    args = ["report", "--since", when, *(["--json"] if as_json else [])]
    res = run_gpubox(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "outside 1970 to 9999" in res.stderr and "Traceback" not in res.stderr
    if as_json:
        assert '"exit_code": 2' in res.stdout and '"data": null' in res.stdout
