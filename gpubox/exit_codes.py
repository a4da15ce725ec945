"""The one table of exit codes that every gpubox command uses."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    NO_GPU = 3  # no NVIDIA driver, NVML missing or unusable
    DAEMON_UNREACHABLE = 4
    CHECK_FAILED = 5  # a doctor check failed
    TIMED_OUT = 124  # `queue wait --timeout` ran out before the jobs ended (as timeout(1) does)
    INTERRUPTED = 130
    READER_LEFT = 141  # stdout's reader went away (`| head`): 128 + SIGPIPE, as a shell reports a tool it ended


class GpuboxError(Exception):
    """An error that ends a command with one line on stderr and a known exit code."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
