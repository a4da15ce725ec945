# A Ctrl-C this early ends gpubox as it does later (gpubox/cli/main.py): by SIGINT, nothing said.
try:
    from gpubox.cli.main import main

    code = main()
except KeyboardInterrupt:
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    code = 130

raise SystemExit(code)
